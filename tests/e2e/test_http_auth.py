"""API keys on the real server: 401 without one, 403 for the wrong role, another tenant's ids are 404."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from flowledger.adapters.cli.keys_commands import keys_required
from flowledger.adapters.cli.main import app as cli
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import Keyring
from flowledger.adapters.simulator import Simulator
from flowledger.domain.aggregate import actor_of
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.keys import PostgresKeyStore, StaticKeys
from tests.conftest import make_settings
from tests.e2e.live_http import (
    ACME_READER,
    ACME_WRITER,
    GLOBEX_WRITER,
    READ_S,
    bearer,
    keyed_app,
    keyed_engine,
    live_server,
)
from tests.support.simulated import list_cost

JSON = {"content-type": "application/json"}
OPEN_PATHS = {"/healthz", "/readyz", "/dashboard", "/dashboard/login", "/dashboard/logout"}


@pytest.fixture
def acme(simulator: Simulator) -> Iterator[Engine]:
    # These tests send every route a refused key from one address, far past the limit on
    # refused keys per address, which has tests of its own (test_http_key_guesses.py).
    engine = keyed_engine(simulator, http_auth_failures=100_000)
    yield engine
    engine.close()


@pytest.fixture
def server(acme: Engine) -> Iterator[httpx.Client]:
    with live_server(keyed_app(acme)) as url, httpx.Client(base_url=url, timeout=READ_S) as client:
        yield client


def operations(client: httpx.Client) -> list[tuple[str, str]]:
    """Every (method, path) of the OpenAPI document, path parameters filled with ``x``."""
    paths = client.get("/openapi.json").json()["paths"]
    return [(method.upper(), _filled(path)) for path, methods in paths.items() for method in methods]


def _filled(path: str) -> str:
    for name in ("session_id", "task_id", "agent_id", "workflow"):
        path = path.replace("{" + name + "}", "x")
    return path


def test_every_route_but_health_refuses_a_request_without_a_key(server: httpx.Client) -> None:
    # Given the operations of the OpenAPI document
    calls = [(m, p) for m, p in operations(server) if p not in OPEN_PATHS]
    assert len(calls) >= 20
    for method, path in calls:
        # When one is called without a key, with a wrong one, or with a key in a bad header
        for headers in ({}, bearer("not-a-key"), {"X-API-Key": "nope"}, {"Authorization": "Basic eDp5"}):
            response = server.request(method, path, json={}, headers=headers)
            # Then it is 401 in the error envelope, and asks for a bearer key
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["success"] is False
            assert "key" in response.json()["error"]
            assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"session_id":', b"\xe9", b"[" * 5000 + b"]" * 5000],
    ids=["not-json", "truncated", "not-utf8", "too-deep"],
)
def test_a_body_that_cannot_be_read_is_401_without_a_key_not_400(
    server: httpx.Client, content: bytes
) -> None:
    # Given the operations that take a JSON body
    calls = [(m, p) for m, p in operations(server) if m in {"POST", "PUT", "PATCH"} and p not in OPEN_PATHS]
    assert len(calls) >= 20
    for method, path in calls:
        # When one is sent a body that is not JSON, without a key or with a wrong one
        for headers in ({}, bearer("not-a-key"), {"X-API-Key": "nope"}):
            headers = {**headers, "content-type": "application/json"}
            response = server.request(method, path, content=content, headers=headers)
            # Then it is refused for the key, as with a readable body: the body is nobody's business
            # until the caller is known (FastAPI reads it before the key is looked at)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
    # And with a key the same body is what is wrong (400, saying why)
    response = server.post("/v1/sessions", content=content, headers={**bearer(ACME_WRITER), **JSON})
    assert response.status_code == 400
    assert response.json()["error"].startswith("body: ")


def test_a_body_that_cannot_be_read_is_403_for_a_key_whose_role_may_not_send_it(
    server: httpx.Client, acme: Engine
) -> None:
    # Given the operations a reader may not call (the webhook's role depends on its action)
    calls = [
        (m, p)
        for m, p in operations(server)
        if m in {"POST", "PUT", "PATCH"} and p not in OPEN_PATHS and p != "/webhook/workflow-state"
    ]
    assert len(calls) >= 20
    head = acme.log.head()
    for method, path in calls:
        for content in (b"not json", b"\xe9"):
            # When a reader sends one a body that is not JSON
            response = server.request(method, path, content=content, headers={**bearer(ACME_READER), **JSON})
            # Then it is refused for its role, as with a readable body (it was told about the body)
            assert response.status_code == 403, (method, path, content, response.text)
            assert "role (reader)" in response.json()["error"]
    # And nothing was written; a writer is still told what is wrong with the body
    assert acme.log.head() == head
    response = server.post("/v1/sessions", content=b"not json", headers={**bearer(ACME_WRITER), **JSON})
    assert response.status_code == 400


def test_a_compressed_body_is_401_without_a_key_not_415(server: httpx.Client) -> None:
    # A body the server does not decode (Content-Encoding) is nobody's business until the caller is known
    coded = {**JSON, "content-encoding": "gzip"}
    for headers in ({}, bearer("not-a-key")):
        response = server.post("/v1/sessions", content=b"\x1f\x8b", headers={**headers, **coded})
        assert response.status_code == 401, response.text
    response = server.post("/v1/sessions", content=b"\x1f\x8b", headers={**bearer(ACME_READER), **coded})
    assert response.status_code == 403, response.text
    response = server.post("/v1/sessions", content=b"\x1f\x8b", headers={**bearer(ACME_WRITER), **coded})
    assert response.status_code == 415, response.text


def test_the_health_probes_need_no_key(server: httpx.Client) -> None:
    assert server.get("/healthz").json() == {"status": "ok"}
    assert server.get("/readyz").json() == {"status": "ok"}


def test_bearer_and_x_api_key_both_carry_a_key(server: httpx.Client) -> None:
    body = {"session_id": "s1", "workflow": "cs"}
    started = server.post("/v1/sessions", json=body, headers=bearer(ACME_WRITER))
    assert started.status_code == 201
    assert server.get("/v1/sessions/s1", headers={"X-API-Key": ACME_READER}).status_code == 200


def test_two_different_keys_in_one_request_are_refused(server: httpx.Client) -> None:
    # When a request carries one tenant's key as a bearer token and another's as X-API-Key
    # (or a revoked one beside a good one)
    two = server.get("/v1/tasks", headers={**bearer(GLOBEX_WRITER), "X-API-Key": ACME_WRITER})
    # Then neither acts for it: 401, said plainly
    assert two.status_code == 401
    assert "two different API keys" in two.json()["error"]
    # And the same key twice, or a proxy's Basic credentials beside a key, are still one key
    assert (
        server.get("/v1/tasks", headers={**bearer(ACME_WRITER), "X-API-Key": ACME_WRITER}).status_code == 200
    )
    basic = {"Authorization": "Basic dXNlcjpwYXNz", "X-API-Key": ACME_READER}
    assert server.get("/v1/tasks", headers=basic).status_code == 200
    # And the dashboard page answers the two keys with its login form, as every 401 of the page
    page = server.get("/dashboard", headers={**bearer(GLOBEX_WRITER), "X-API-Key": ACME_WRITER})
    assert page.status_code == 401
    assert page.headers["content-type"].startswith("text/html")
    assert "two different API keys" in page.text


def test_a_reader_key_reads_but_every_command_is_403(server: httpx.Client, acme: Engine) -> None:
    acme.start_session("s1", "cs")
    head = acme.log.head()
    reader = bearer(ACME_READER)
    assert server.get("/v1/sessions/s1", headers=reader).status_code == 200
    assert server.get("/v1/sessions/s1/history", headers=reader).status_code == 200
    writes = [(m, p) for m, p in operations(server) if m in {"POST", "PATCH"} and p.startswith("/v1/")]
    assert len(writes) >= 14
    for method, path in writes:
        response = server.request(method, path, json={}, headers=reader)
        assert response.status_code == 403, (method, path, response.text)
        assert "role (reader)" in response.json()["error"]
    for action in ("create_session", "process_step"):
        response = server.post(
            "/webhook/workflow-state",
            json={"action": action, "session_id": "s1", "workflow_name": "cs", "step_name": "a"},
            headers=reader,
        )
        assert (response.status_code, response.json()["success"]) == (403, False)
    body = {"action": "get_state", "session_id": "s1"}
    state = server.post("/webhook/workflow-state", json=body, headers=reader)
    assert state.json()["data"]["current_step"] == "init"
    assert acme.log.head() == head


def _same_as_unknown(
    client: httpx.Client, method: str, path: str, body: Any, known: str, unknown: str
) -> None:
    """Another tenant's id answers byte for byte as an id nobody ever used."""
    theirs = client.request(method, path.format(id=known), json=body, headers=bearer(GLOBEX_WRITER))
    nobodys = client.request(method, path.format(id=unknown), json=body, headers=bearer(GLOBEX_WRITER))
    assert theirs.status_code == nobodys.status_code, (method, path)
    assert theirs.status_code in {200, 404}, (method, path, theirs.text)
    assert theirs.text == nobodys.text.replace(unknown, known), (method, path)


SESSION_ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/sessions/{id}", None),
    ("GET", "/v1/sessions/{id}/history", None),
    ("POST", "/v1/sessions/{id}/steps", {"step": "a"}),
    ("POST", "/v1/sessions/{id}/process", {"step": "a", "model": "gpt-4.1"}),
    ("PATCH", "/v1/sessions/{id}/context", {"update": {"k": 1}}),
    ("POST", "/v1/sessions/{id}/extend", {"ttl_seconds": 60}),
    ("POST", "/v1/sessions/{id}/complete", {"resolution": "done"}),
    ("POST", "/v1/sessions/{id}/abandon", {}),
    ("POST", "/v1/sessions/{id}/fork", {"at_version": 1, "new_session_id": "fork-of-it"}),
]
TASK_ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/tasks/{id}", None),
    ("GET", "/v1/tasks/{id}/history", None),
    ("POST", "/v1/tasks/{id}/assign", None),
    ("POST", "/v1/tasks/{id}/start", None),
    ("POST", "/v1/tasks/{id}/complete", {}),
    ("POST", "/v1/tasks/{id}/release", {}),
    (
        "POST",
        "/v1/tasks/{id}/classification",
        {"category": "review", "complexity": "low", "estimated_hours": 1},
    ),
    ("GET", "/v1/agents/{id}", None),
]


def test_another_tenants_session_task_or_agent_answers_exactly_as_an_unknown_one(
    server: httpx.Client, acme: Engine
) -> None:
    # Given a session, a task and an agent of tenant acme
    acme.start_session("sess-acme-1", "cs", user_id="u1")
    acme.create_task("task-acme-1", "Fix it", ["python"])
    acme.register_agent("agent-acme-1", "Ada", ["python"], capacity=2)
    head = acme.log.head()
    # When globex's key names them on every route, Then each answers as for an id never used
    for method, path, body in SESSION_ROUTES:
        _same_as_unknown(server, method, path, body, "sess-acme-1", "sess-none-1")
    for method, path, body in TASK_ROUTES:
        kind = "agent" if "agents" in path else "task"
        known, unknown = f"{kind}-acme-1", f"{kind}-none-1"
        _same_as_unknown(server, method, path, body, known, unknown)
    for action in ("get_state", "process_step"):
        body = {"action": action, "session_id": "{id}", "step_name": "a", "model": "gpt-4.1"}
        theirs, nobodys = (
            server.post(
                "/webhook/workflow-state",
                content=json.dumps(body).replace("{id}", sid),
                headers={**bearer(GLOBEX_WRITER), "content-type": "application/json"},
            )
            for sid in ("sess-acme-1", "sess-none-1")
        )
        assert theirs.status_code == nobodys.status_code
        assert theirs.text == nobodys.text.replace("sess-none-1", "sess-acme-1")
    # And acme's data is untouched, and globex sees no agent
    assert acme.log.head() == head
    assert server.get("/v1/agents", headers=bearer(GLOBEX_WRITER)).json() == []
    assert acme.get_session("sess-acme-1").status.value == "active"


def test_each_event_records_the_key_that_wrote_it(server: httpx.Client, acme: Engine) -> None:
    writer = bearer(ACME_WRITER)
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs"}, headers=writer)
    server.post("/v1/sessions/s1/steps", json={"step": "a"}, headers=writer)
    server.post(
        "/webhook/workflow-state",
        json={"action": "create_session", "session_id": "s2", "workflow_name": "cs"},
        headers=writer,
    )
    key_id = Keyring.of(acme).static.find(ACME_WRITER)
    assert key_id is not None
    events = acme.log.stream(acme.session_uuid("s1")) + acme.log.stream(acme.session_uuid("s2"))
    assert [actor_of(e) for e in events] == [key_id.key_id] * 3


def test_a_step_claiming_another_user_than_the_sessions_is_403_and_appends_nothing(
    server: httpx.Client, acme: Engine
) -> None:
    writer = bearer(ACME_WRITER)
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs", "user_id": "u1"}, headers=writer)
    head = acme.log.head()
    refused = server.post("/v1/sessions/s1/steps", json={"step": "a", "user_id": "u2"}, headers=writer)
    assert (refused.status_code, refused.json()["success"]) == (403, False)
    assert "another user" in refused.json()["error"]
    hook = server.post(
        "/webhook/workflow-state",
        json={"action": "process_step", "session_id": "s1", "user_id": "u2", "step_name": "a"},
        headers=writer,
    )
    assert (hook.status_code, hook.json()["success"]) == (403, False)
    assert acme.log.head() == head
    own = server.post("/v1/sessions/s1/steps", json={"step": "a", "user_id": "u1"}, headers=writer)
    assert own.status_code == 201


def test_a_webhook_read_or_extension_claiming_another_user_is_403_shows_nothing_and_appends_nothing(
    server: httpx.Client, acme: Engine
) -> None:
    # Given a session of u1 whose context holds u1's data
    writer = bearer(ACME_WRITER)
    hook = "/webhook/workflow-state"
    server.post(
        hook,
        json={"action": "create_session", "session_id": "s1", "workflow_name": "cs", "user_id": "u1"},
        headers=writer,
    )
    server.post(
        hook,
        json={
            "action": "process_step",
            "session_id": "s1",
            "user_id": "u1",
            "step_name": "a",
            "input_data": {"card": "4111"},
        },
        headers=writer,
    )
    head = acme.log.head()
    for action in ("get_state", "extend_session"):
        # When the webhook is asked to read or extend it for u2
        body = {"action": action, "session_id": "s1", "user_id": "u2", "expires_hours": 1}
        refused = server.post(hook, json=body, headers=writer)
        # Then it is refused as a step for u2 is, shows none of u1's data and records nothing
        assert (refused.status_code, refused.json()["success"]) == (403, False), (action, refused.text)
        assert "another user" in refused.json()["error"]
        assert "4111" not in refused.text
    assert acme.log.head() == head
    # And u1, or a call that names no user (the seed's own node), still reads it
    for claimed in ({"user_id": "u1"}, {}):
        own = server.post(hook, json={"action": "get_state", "session_id": "s1", **claimed}, headers=writer)
        assert own.json()["data"]["context"]["card"] == "4111", own.text


def test_starting_again_a_session_of_another_user_is_409_without_naming_that_user(
    server: httpx.Client, acme: Engine
) -> None:
    # Given a session of a user whose id is an email address
    writer = bearer(ACME_WRITER)
    owner = "alice@example.com"
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs", "user_id": owner}, headers=writer)
    head = acme.log.head()
    # When it is started again for another user, over REST and by the webhook (both modes)
    answers = [
        server.post(
            "/v1/sessions", json={"session_id": "s1", "workflow": "cs", "user_id": "u2"}, headers=writer
        ),
        *(
            server.post(
                "/webhook/workflow-state",
                json={
                    "action": "create_session",
                    "session_id": "s1",
                    "workflow_name": "cs",
                    "user_id": "u2",
                    "strict": strict,
                },
                headers=writer,
            )
            for strict in (False, True)
        ),
    ]
    # Then it conflicts (409) saying so, without telling that user who owns it, and records nothing
    for refused in answers:
        assert refused.status_code == 409, refused.text
        assert "another user" in refused.json()["error"]
        assert owner not in refused.text
    assert acme.log.head() == head


def test_keys_made_by_the_cli_are_shown_once_stored_hashed_listed_without_secrets_and_revocable(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWLEDGER_DATABASE_URL", database_url)
    monkeypatch.setenv("FLOWLEDGER_SCHEMA", pg_schema)
    runner = CliRunner()
    # When a key is created
    made = runner.invoke(cli, ["keys", "create", "--tenant", "acme", "--role", "writer", "--label", "dify"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("flk_")
    # Then the table holds its hash only, and the list shows no secret
    store = PostgresKeyStore(database_url, pg_schema)
    try:
        (key,) = store.list()
        assert (key.tenant, key.role, key.label) == ("acme", "writer", "dify")
        listed = runner.invoke(cli, ["keys", "list"])
        assert key.key_id in listed.stdout
        assert token.removeprefix(f"flk_{key.key_id}_") not in listed.stdout
        engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, tenant="acme"))
        with live_server(create_app(engine)) as url:
            assert httpx.get(f"{url}/v1/agents", headers=bearer(token)).status_code == 200
            assert httpx.get(f"{url}/v1/agents").status_code == 401  # a stored key closes the app
        engine.close()
        # And once revoked, the key is refused
        assert runner.invoke(cli, ["keys", "revoke", key.key_id]).exit_code == 0
        assert store.find(token) is None
        assert runner.invoke(cli, ["keys", "revoke", key.key_id]).exit_code == 3
        assert runner.invoke(cli, ["keys", "create", "--tenant", "acme", "--role", "root"]).exit_code == 2
    finally:
        store.close()


def _keys_or_loopback(host: str, keys: Keyring, insecure: bool) -> bool:
    return keys_required(host, keys, insecure=insecure, console=Console(file=io.StringIO()))


def test_serve_refuses_a_network_address_with_no_key_unless_insecure() -> None:
    nothing = Keyring(StaticKeys((), salt=b"test salt"), None)
    with pytest.raises(typer.BadParameter, match="--insecure"):
        _keys_or_loopback("0.0.0.0", nothing, insecure=False)
    assert _keys_or_loopback("0.0.0.0", nothing, insecure=True) is False
    assert _keys_or_loopback("127.0.0.1", nothing, insecure=False) is False
    assert _keys_or_loopback("::1", nothing, insecure=False) is False
    with_keys = Keyring(StaticKeys((("acme", "reader", ACME_READER),), salt=b"test salt"), None)
    assert _keys_or_loopback("0.0.0.0", with_keys, insecure=False) is True


def test_the_dashboard_page_signs_in_through_a_form_that_sets_an_httponly_samesite_cookie(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    engine = keyed_engine(simulator, database_url=database_url, schema=pg_schema)
    try:
        with live_server(keyed_app(engine)) as url, httpx.Client(base_url=url) as client:
            # Without a key: the form, 401
            page = client.get("/dashboard")
            assert page.status_code == 401
            assert '<form method="post" action="/dashboard/login">' in page.text
            # A key in the URL is refused unless enabled
            assert client.get("/dashboard", params={"key": ACME_READER}).status_code == 401
            # A wrong key: the form again, with a message
            wrong = client.post("/dashboard/login", data={"key": "nope"})
            assert wrong.status_code == 401
            assert "unknown or revoked" in wrong.text
            # The right key: a cookie, HttpOnly, SameSite=Strict, for /dashboard only
            signed = client.post("/dashboard/login", data={"key": ACME_READER})
            assert signed.status_code == 303
            cookie = signed.headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=strict" in cookie
            assert "Path=/dashboard" in cookie
            assert client.get("/dashboard").status_code == 200
            # The cookie opens the page only, never the JSON API
            assert client.get("/v1/dashboard").status_code == 401
            client.post("/dashboard/logout")
            assert client.get("/dashboard").status_code == 401
    finally:
        engine.close()


def test_the_steps_a_model_call_writes_record_the_key_too(
    server: httpx.Client, acme: Engine, simulator: Simulator
) -> None:
    writer = bearer(ACME_WRITER)
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs"}, headers=writer)
    processed = server.post("/v1/sessions/s1/process", json={"step": "a", "model": "gpt-4.1"}, headers=writer)
    assert processed.status_code == 201
    # The call went through the real client: the simulator's usage at gpt-4.1's list price
    exchange = simulator.exchanges[-1]
    assert exchange.model == "gpt-4.1"
    assert Decimal(processed.json()["usage"]["cost_usd"]) == list_cost(exchange.reply)
    key = Keyring.of(acme).static.find(ACME_WRITER)
    assert key is not None
    assert {actor_of(e) for e in acme.log.stream(acme.session_uuid("s1"))} == {key.key_id}
