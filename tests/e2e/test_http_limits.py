"""Bounded input on the real server: 413, 429, bad text and numbers refused with 4xx, probes, no bare 500."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from flowledger.adapters.simulator import Simulator
from flowledger.domain.errors import SessionArchived
from flowledger.infrastructure import Engine
from tests.e2e.live_http import ACME_WRITER, READ_S, bearer, keyed_app, keyed_engine, live_server

WRITER = {**bearer(ACME_WRITER), "content-type": "application/json"}


@pytest.fixture
def acme(simulator: Simulator) -> Iterator[Engine]:
    engine = keyed_engine(simulator, http_max_body_bytes=4096, http_rate_per_s=1000.0, http_rate_burst=1000)
    engine.start_session("s1", "cs", user_id="u1")
    engine.create_task("t1", "Fix it", ["python"])
    yield engine
    engine.close()


@pytest.fixture
def server(acme: Engine) -> Iterator[httpx.Client]:
    with live_server(keyed_app(acme)) as url, httpx.Client(base_url=url, timeout=READ_S) as client:
        yield client


def test_a_body_over_the_limit_is_413_by_its_length_and_appends_nothing(
    server: httpx.Client, acme: Engine
) -> None:
    head = acme.log.head()
    big = {"step": "a", "input": {"text": "x" * 5000}}
    response = server.post("/v1/sessions/s1/steps", json=big, headers=WRITER)
    assert response.status_code == 413
    assert response.json() == {
        "success": False,
        "error": "the request body is larger than the limit of 4,096 bytes",
    }
    hook = server.post(
        "/webhook/workflow-state", json={"action": "get_state", "input_data": big}, headers=WRITER
    )
    assert (hook.status_code, hook.json()["success"]) == (413, False)
    assert acme.log.head() == head


def test_a_chunked_body_over_the_limit_is_413_too(server: httpx.Client, acme: Engine) -> None:
    head = acme.log.head()

    def chunks() -> Iterator[bytes]:
        yield b'{"step": "a", "input": {"text": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}}'

    # A generator body goes out with Transfer-Encoding: chunked and no Content-Length.
    response = server.post("/v1/sessions/s1/steps", content=chunks(), headers=WRITER)
    assert response.status_code == 413
    assert response.json()["success"] is False
    assert acme.log.head() == head
    small = server.post("/v1/sessions/s1/steps", content=iter([b'{"step": "a"}']), headers=WRITER)
    assert small.status_code == 201


def test_past_its_rate_a_key_gets_429_with_retry_after(simulator: Simulator) -> None:
    engine = keyed_engine(simulator, http_rate_per_s=0.5, http_rate_burst=3)
    try:
        with live_server(keyed_app(engine)) as url:
            # (A generous timeout: a loaded machine can take seconds to check a key the first time.)
            statuses = [
                httpx.get(f"{url}/v1/agents", headers=bearer(ACME_WRITER), timeout=60) for _ in range(4)
            ]
            assert [r.status_code for r in statuses] == [200, 200, 200, 429]
            # A token comes every 2 s: at most 2 s to wait, less if the requests took a while
            assert statuses[-1].headers["retry-after"] in ("1", "2")
            assert "rate limit" in statuses[-1].json()["error"]
            # another key has its own bucket; the probes have none
            assert httpx.get(
                f"{url}/v1/agents", headers=bearer("acme-reader-0123456789abcdef0123456789"), timeout=60
            ).is_success
            assert all(httpx.get(f"{url}/healthz", timeout=60).is_success for _ in range(5))
    finally:
        engine.close()


NUL, SURROGATE = "\u0000", "\ud800"
HUGE = 10**400


def raw(body: dict[str, Any]) -> str:
    """JSON text for ``body``; huge ints and lone surrogates are written as a client could send them."""
    return json.dumps(body).replace('"HUGE"', str(HUGE)).replace('"1E400"', "1e400")


BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/sessions", {"session_id": f"a{NUL}b", "workflow": "cs"}),
    ("POST", "/v1/sessions", {"session_id": "n1", "workflow": f"cs{NUL}"}),
    ("POST", "/v1/sessions", {"session_id": "n1", "workflow": "cs", "user_id": f"u{NUL}"}),
    ("POST", "/v1/sessions", {"session_id": f"a{SURROGATE}", "workflow": "cs"}),
    ("POST", "/v1/sessions", {"session_id": "n1", "workflow": "cs", "ttl_seconds": "1E400"}),
    ("POST", "/v1/sessions", {"session_id": "n1", "workflow": "cs", "ttl_seconds": 1e300}),
    ("POST", "/v1/sessions", {"session_id": "n1", "workflow": "cs", "metadata": {"k": f"v{NUL}"}}),
    ("POST", "/v1/sessions/s1/steps", {"step": f"a{NUL}"}),
    ("POST", "/v1/sessions/s1/steps", {"step": f"a{SURROGATE}"}),
    ("POST", "/v1/sessions/s1/steps", {"step": "a", "input": {"m": f"x{NUL}"}}),
    ("POST", "/v1/sessions/s1/steps", {"step": "a", "usage": {"input_tokens": "HUGE"}}),
    ("POST", "/v1/sessions/s1/steps", {"step": "a", "usage": {"latency_ms": "1E400"}}),
    ("POST", "/v1/sessions/s1/extend", {"ttl_seconds": 1e300}),
    ("POST", "/v1/tasks", {"task_id": "t2", "description": "d", "deadline_hours": 1e300}),
    ("POST", "/v1/tasks", {"task_id": f"t{NUL}", "description": "d"}),
    ("POST", "/v1/agents", {"agent_id": "a1", "name": "A", "skills": ["py"], "capacity": "HUGE"}),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "create_session", "session_id": f"w{NUL}", "workflow_name": "cs"},
    ),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "create_session", "session_id": "w1", "workflow_name": f"c{NUL}"},
    ),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "create_session", "session_id": f"w{SURROGATE}", "workflow_name": "cs"},
    ),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "create_session", "session_id": "w1", "workflow_name": "cs", "expires_hours": 1e300},
    ),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "process_step", "session_id": "s1", "step_name": f"s{NUL}"},
    ),
    (
        "POST",
        "/webhook/workflow-state",
        {"action": "process_step", "session_id": "s1", "step_name": "s", "user_id": f"u{NUL}"},
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD_REQUESTS, ids=lambda v: str(v)[:40])
def test_nul_bytes_lone_surrogates_and_huge_numbers_answer_4xx_with_a_message_and_append_nothing(
    server: httpx.Client, acme: Engine, method: str, path: str, body: dict[str, Any]
) -> None:
    head = acme.log.head()
    response = server.request(method, path, content=raw(body), headers=WRITER)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["success"] is False
    assert response.json()["error"]
    assert acme.log.head() == head


def test_a_huge_version_or_window_in_a_query_is_422(server: httpx.Client) -> None:
    assert server.get("/v1/sessions/s1", params={"version": str(HUGE)}, headers=WRITER).status_code == 422
    assert server.get("/v1/dashboard", params={"since": "9" * 19 + "w"}, headers=WRITER).status_code == 422


def test_readyz_answers_503_within_its_deadline_when_the_database_does_not_answer(acme: Engine) -> None:
    # Given a "database" that accepts connections and never answers
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    app = keyed_app(acme)
    settings = acme.settings.with_overrides(ready_timeout_s=0.3)
    app.state.engine = SimpleNamespace(database_url=f"postgresql://x@127.0.0.1:{port}/x", settings=settings)
    try:
        with live_server(app) as url:
            # When probed twice, Then each answers 503 within the deadline
            for _ in range(2):
                started = time.monotonic()
                response = httpx.get(f"{url}/readyz", timeout=5)
                assert response.status_code == 503
                # Ended by its own deadline, not by libpq's connect timeout (2 s at least) ...
                assert response.json()["error"] == "the database did not answer within 0.3 s"
                # ... and answered in about that time (a loaded 2-core machine took 1.7 s, one
                # with a load average of 14 took 3.4 s)
                assert time.monotonic() - started < 5.0
                assert response.json()["error"] == "the database did not answer within 0.3 s"
    finally:
        silent.close()


def test_an_unexpected_error_is_a_json_500_naming_the_request_id_in_the_log(
    acme: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app = keyed_app(acme)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("kaboom")

    with live_server(app) as url, caplog.at_level(logging.INFO, logger="flowledger.http"):
        response = httpx.get(f"{url}/boom", headers={"X-Request-Id": "req-42"})
    assert response.status_code == 500
    assert response.json() == {
        "success": False,
        "error": "internal error: the server's log has it under request id req-42",
        "request_id": "req-42",
    }
    assert response.headers["x-request-id"] == "req-42"
    (error,) = [r for r in caplog.records if r.name == "flowledger.http.errors"]
    assert "req-42" in error.getMessage()
    assert error.exc_info is not None


def test_an_archived_session_is_a_404_naming_its_bundle_but_not_where_the_server_keeps_it(
    acme: Engine,
) -> None:
    app = keyed_app(acme)

    @app.get("/archived")
    def archived() -> None:
        raise SessionArchived("s-1", "/srv/flowledger/archive/acme-support-20261201T000000-0123.jsonl")

    with live_server(app) as url:
        response = httpx.get(f"{url}/archived")
    assert response.status_code == 404
    error = response.json()["error"]
    assert "session 's-1' was archived" in error
    assert "acme-support-20261201T000000-0123.jsonl" in error
    assert "/srv/flowledger" not in error  # a tenant's client learns no server path


def test_the_access_log_is_one_json_line_per_request_without_secrets_or_bodies(
    server: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="flowledger.http.access"):
        server.post("/v1/sessions/s1/steps", json={"step": "secret-step"}, headers=WRITER)
        # A query the operation declares (one it does not is refused, 422): not logged either
        server.get("/v1/tasks?agent_id=private", headers={"X-API-Key": "wrong-key"})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "flowledger.http.access"]
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/v1/sessions/s1/steps", 201),
        ("GET", "/v1/tasks", 401),
    ]
    assert lines[0]["tenant"] == "acme"
    assert lines[0]["key_id"].startswith("env-")
    assert {"request_id", "duration_ms", "client"} <= set(lines[0])
    text = " ".join(r.getMessage() for r in caplog.records)
    for secret in (ACME_WRITER, "wrong-key", "secret-step", "private"):
        assert secret not in text


def test_a_key_sent_in_the_path_or_as_the_request_id_is_kept_out_of_the_access_log(
    server: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a stored key's shape (a client pasting one where an id goes) and the request's own key
    stored = "flk_0ds13hlk4iwj_LGGJdaMKfNEFq5IzZYMhSfGCAeLn3jatux7vUWNIu84"
    with caplog.at_level(logging.INFO, logger="flowledger.http"):
        # When they are sent in a path and as X-Request-Id
        in_path = server.get(f"/v1/sessions/{ACME_WRITER}/history", headers=WRITER)
        stored_in_path = server.get(f"/v1/tasks/{stored}", headers=WRITER)
        as_id = server.get("/v1/tasks/t1", headers={**WRITER, "X-Request-Id": ACME_WRITER})
        stored_as_id = server.get("/v1/tasks/t1", headers={**WRITER, "X-Request-Id": stored})
    # Then the requests are answered, and no key is in the log or an answer's request id
    assert [r.status_code for r in (in_path, stored_in_path, as_id, stored_as_id)] == [404, 404, 200, 200]
    text = " ".join(r.getMessage() for r in caplog.records)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "flowledger.http.access"]
    assert len(lines) == 4
    for key in (ACME_WRITER, stored, stored.rsplit("_", 1)[1]):
        assert key not in text
        assert key not in as_id.headers["x-request-id"] + stored_as_id.headers["x-request-id"]
    assert lines[0]["path"] == "/v1/sessions/<key>/history"
    assert lines[1]["path"] == "/v1/tasks/<key>"
