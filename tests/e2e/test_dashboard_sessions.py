"""The dashboard's sign-in cookie holds a session derived from the key, never the key: it opens
the page as a reader, is no API key, cannot be altered or extended, and ends with its key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import COOKIE
from flowledger.adapters.http.dashboard_sessions import SESSION_S, session_for
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.keys import PostgresKeyStore, digest
from tests.conftest import make_settings
from tests.e2e.live_http import ACME_WRITER, GLOBEX_WRITER, KEYS, bearer

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def client(database_url: str, pg_schema: str) -> Iterator[TestClient]:
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme", api_keys=KEYS)
    with Engine(settings=settings) as engine, TestClient(create_app(engine, require_keys=True)) as test:
        engine.start_session("a-1", "support")
        yield test


def signed_in(client: TestClient, key: str) -> str:
    answer = client.post("/dashboard/login", data={"key": key}, headers=SAME_ORIGIN, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    cookie = client.cookies.get(COOKIE)
    assert cookie is not None
    return str(cookie)


def test_the_cookie_is_a_session_that_opens_the_page_and_nothing_else(client: TestClient) -> None:
    # When a writer signs in to the dashboard
    cookie = signed_in(client, ACME_WRITER)
    # Then the cookie does not hold the key, and opens the page
    assert ACME_WRITER not in cookie
    assert ACME_WRITER[-12:] not in cookie
    assert client.get("/dashboard").status_code == 200
    # And it is no API key: as a bearer token the API refuses it
    client.cookies.clear()
    assert client.get("/v1/sessions/a-1", headers=bearer(cookie)).status_code == 401
    assert client.get("/v1/sessions/a-1", headers=bearer(ACME_WRITER)).status_code == 200


@pytest.mark.parametrize("part", [1, 2, 3])
def test_an_altered_session_opens_nothing(client: TestClient, part: int) -> None:
    cookie = signed_in(client, ACME_WRITER)
    pieces = cookie.split(".")
    # Another key's id, a later end (a session extended by hand), or another MAC
    pieces[part] = {1: "env-0000000000", 2: str(int(pieces[2]) + 86_400), 3: "0" * 64}[part]
    client.cookies.clear()
    client.cookies.set(COOKIE, ".".join(pieces), path="/dashboard")

    page = client.get("/dashboard")

    assert page.status_code == 401
    assert "API key" in page.text  # the login form again


def test_a_session_ends_after_its_hours(client: TestClient) -> None:
    key_id = signed_in(client, ACME_WRITER).split(".")[1]  # the key's id, salted (key_ids)
    client.cookies.clear()
    ended = session_for(key_id, digest(ACME_WRITER), time.time() - SESSION_S - 1)
    current = session_for(key_id, digest(ACME_WRITER), time.time())
    client.cookies.set(COOKIE, current, path="/dashboard")
    assert client.get("/dashboard").status_code == 200
    client.cookies.clear()
    client.cookies.set(COOKIE, ended, path="/dashboard")
    assert client.get("/dashboard").status_code == 401


def test_revoking_the_key_ends_its_sessions_at_once(database_url: str, pg_schema: str) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme")
    store = PostgresKeyStore(database_url, pg_schema, settings)
    try:
        issued = store.create("acme", "reader", "dashboard")
        with Engine(settings=settings) as engine, TestClient(create_app(engine, require_keys=True)) as client:
            signed_in(client, issued.token)
            assert client.get("/dashboard").status_code == 200
            assert store.revoke(issued.key.key_id)
            assert client.get("/dashboard").status_code == 401
    finally:
        store.close()


def test_a_browser_signed_in_before_keeps_no_key_a_raw_key_cookie_is_refused(client: TestClient) -> None:
    # A cookie written by an older server held the key itself: it is no session, so the
    # browser is asked to sign in again (and gets a session), rather than trusted as a key
    client.cookies.set(COOKIE, ACME_WRITER, path="/dashboard")
    assert client.get("/dashboard").status_code == 401
    assert httpx.codes.is_success(client.get("/dashboard", headers=bearer(ACME_WRITER)).status_code)


def test_signing_out_ends_the_session_for_whoever_kept_the_cookie(client: TestClient) -> None:
    """A sign-out ends the session on the server, not only in the browser: a copy of the cookie
    (a shared machine, a proxy's log) opened the page for the rest of its 8 hours."""
    # Given a signed-in browser whose cookie someone copied
    cookie = signed_in(client, ACME_WRITER)
    assert client.get("/dashboard").status_code == 200
    # When the browser signs out
    assert client.post("/dashboard/logout", headers=SAME_ORIGIN, follow_redirects=False).status_code == 303
    # Then the copied cookie opens nothing: the login form again
    client.cookies.clear()
    client.cookies.set(COOKIE, cookie, path="/dashboard")
    replayed = client.get("/dashboard")
    assert replayed.status_code == 401
    assert "API key" in replayed.text
    # And signing in again, even within the same second, opens the page
    client.cookies.clear()
    again = signed_in(client, ACME_WRITER)
    assert again != cookie
    assert client.get("/dashboard").status_code == 200


def test_a_sign_out_on_one_server_ends_the_session_on_every_server(database_url: str, pg_schema: str) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme")
    store = PostgresKeyStore(database_url, pg_schema, settings)
    try:
        issued = store.create("acme", "reader", "dashboard")
        with (
            Engine(settings=settings) as one,
            Engine(settings=settings) as two,
            TestClient(create_app(one, require_keys=True)) as first,
            TestClient(create_app(two, require_keys=True)) as second,
        ):
            # Given a session made on one server, which the other accepts too
            cookie = signed_in(first, issued.token)
            second.cookies.set(COOKIE, cookie, path="/dashboard")
            assert second.get("/dashboard").status_code == 200
            # When the browser signs out on the first
            assert (
                first.post("/dashboard/logout", headers=SAME_ORIGIN, follow_redirects=False).status_code
                == 303
            )
            # Then the second refuses the cookie too, and the key itself still works
            assert second.get("/dashboard").status_code == 401
            assert second.get("/v1/tasks", headers=bearer(issued.token)).status_code == 200
            # And a new sign-in opens the page on both
            fresh = signed_in(first, issued.token)
            second.cookies.set(COOKIE, fresh, path="/dashboard")
            assert second.get("/dashboard").status_code == 200
    finally:
        store.close()


def test_a_login_form_with_two_different_keys_signs_in_as_neither(client: TestClient) -> None:
    """As two different keys in one request's headers are a 401: the form's first key used to
    sign in unnoticed (``key=<acme's>&key=<globex's>`` opened acme's page)."""
    # When a form posted to the login carries two different keys
    answer = client.post(
        "/dashboard/login",
        content=urlencode([("key", ACME_WRITER), ("key", GLOBEX_WRITER)]),
        headers={**SAME_ORIGIN, "content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    # Then neither signs in: the form again, saying why, and no cookie
    assert answer.status_code == 401
    assert "two different API keys" in answer.text
    assert client.cookies.get(COOKIE) is None
    # And the same key twice is still one key
    again = client.post(
        "/dashboard/login",
        content=urlencode([("key", ACME_WRITER), ("key", ACME_WRITER)]),
        headers={**SAME_ORIGIN, "content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert again.status_code == 303
