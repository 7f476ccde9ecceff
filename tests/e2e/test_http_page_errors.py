"""The pages a person opens in a browser (``/dashboard``, the login and logout forms) answer an
error as a page: the database down is a 503 HTML page with ``Retry-After`` (it was the API's
JSON envelope, shown by the browser as raw text), a fault of the server an HTML 500 naming the
request id. The JSON API keeps its envelope for the same errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http import dashboard
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import COOKIE
from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.live_http import ACME_READER, KEYS, bearer

OUTAGES = [
    StoreUnavailable("read", "couldn't get a connection after 5.00 sec", retry_after=2.5),
    psycopg.OperationalError("connection failed: Connection refused"),
]


def raising(error: BaseException) -> Any:
    def fail(*_: object, **__: object) -> None:
        raise error

    return fail


@pytest.fixture
def keyed() -> Iterator[TestClient]:
    """An app that needs a key on every route, over an in-memory engine of tenant acme."""
    engine = Engine(settings=make_settings(database_url="memory:", tenant="acme", api_keys=KEYS))
    with TestClient(create_app(engine, require_keys=True), raise_server_exceptions=False) as client:
        yield client
    engine.close()


@pytest.fixture
def open_app() -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine, require_keys=False), raise_server_exceptions=False) as client:
        yield client
    engine.close()


def assert_outage_page(response: Any) -> None:
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("text/html")
    assert int(response.headers["Retry-After"]) >= 1
    assert response.text.startswith("<!doctype html>")
    assert 'role="alert"' in response.text
    assert "the event store is unavailable" in response.text
    assert "script-src" not in response.headers["content-security-policy"]
    assert response.headers["content-security-policy"].startswith("default-src 'none'; style-src 'sha256-")


@pytest.mark.parametrize("error", OUTAGES, ids=lambda e: type(e).__name__)
def test_the_dashboard_page_answers_a_database_outage_with_an_html_503(
    open_app: TestClient, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # Given a database that fails every read of the read models
    monkeypatch.setattr(dashboard, "_render", raising(error))

    # When the page is opened in a browser
    response = open_app.get("/dashboard", headers={"Accept": "text/html"})

    # Then it is a page saying so, with the 503 and Retry-After the API gives
    assert_outage_page(response)
    if isinstance(error, StoreUnavailable):
        assert response.headers["Retry-After"] == "3"
        assert '<meta http-equiv="refresh" content="3">' in response.text


@pytest.mark.parametrize("error", OUTAGES, ids=lambda e: type(e).__name__)
def test_the_pages_answer_a_key_lookup_that_meets_an_outage_with_an_html_503(
    keyed: TestClient, error: Exception
) -> None:
    # Given a server whose key lookups meet a database outage
    keys = keyed.app.state.gate.keys  # type: ignore[attr-defined]
    for lookup in ("find", "find_session", "end_session"):
        setattr(keys, lookup, raising(error))

    # When the page, the login form and the logout form are used
    page = keyed.get("/dashboard", headers=bearer(ACME_READER))
    login = keyed.post("/dashboard/login", data={"key": ACME_READER})
    keyed.cookies.set(COOKIE, "a-session", path="/dashboard")
    logout = keyed.post("/dashboard/logout", follow_redirects=False)

    # Then each is a page saying so
    for response in (page, login, logout):
        assert_outage_page(response)
    # And a page that was posted does not reload itself (the reload would be a GET)
    assert "http-equiv" not in login.text


@pytest.mark.parametrize("error", OUTAGES, ids=lambda e: type(e).__name__)
def test_the_json_api_keeps_its_envelope_for_the_same_outage(keyed: TestClient, error: Exception) -> None:
    keys = keyed.app.state.gate.keys  # type: ignore[attr-defined]
    keys.find = raising(error)
    for path in ("/v1/dashboard", "/v1/tasks"):
        response = keyed.get(path, headers=bearer(ACME_READER))
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["Retry-After"]) >= 1
        assert response.json()["success"] is False
        assert response.json()["error"].startswith("the event store is unavailable")


def test_a_fault_of_the_server_on_the_page_is_an_html_500_naming_the_request_id(
    open_app: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "_render", raising(RuntimeError("kaboom")))
    response = open_app.get("/dashboard", headers={"X-Request-Id": "req-123"})
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/html")
    assert "request id req-123" in response.text
    assert "kaboom" not in response.text


def test_an_error_message_is_escaped_on_the_page(
    open_app: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "_render", raising(StoreUnavailable("read", "<script>x</script>")))
    response = open_app.get("/dashboard")
    assert response.status_code == 503
    assert "<script>" not in response.text
    assert "&lt;script&gt;" in response.text


def test_the_document_lists_the_pages_outage_and_fault_as_html(open_app: TestClient) -> None:
    paths = open_app.get("/openapi.json").json()["paths"]
    for path, method in (("/dashboard", "get"), ("/dashboard/login", "post"), ("/dashboard/logout", "post")):
        answers = paths[path][method]["responses"]
        for status in ("500", "503"):
            assert "text/html" in answers[status]["content"], (path, status)


@pytest.mark.parametrize("path", ["/dashboard/login", "/dashboard/logout"])
def test_a_get_of_the_sign_in_or_out_address_goes_back_to_the_page(keyed: TestClient, path: str) -> None:
    # Given a person signed in (the cookie of a good key)
    signed_in = keyed.post(
        "/dashboard/login",
        data={"key": ACME_READER},
        headers={"origin": "http://testserver"},
        follow_redirects=False,
    )
    assert signed_in.status_code == 303
    # When the browser GETs the form's address (a reload after a refused sign-in, a bookmark)
    answer = keyed.get(path, follow_redirects=False)
    # Then it is sent on to the page (not a JSON 405), and nothing was signed out
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dashboard"
    assert COOKIE not in answer.headers.get("set-cookie", "")
    # (the page answers the signed-in reader, not the form; in memory it says the read
    # models need PostgreSQL)
    page = keyed.get("/dashboard")
    assert page.status_code != 401
    assert "text/html" in page.headers["content-type"]
    assert 'name="key"' not in page.text
