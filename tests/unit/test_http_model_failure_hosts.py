"""A failed model call is told to the caller without the model endpoint's URL or host (where
this server's model traffic goes is its operator's business, not its callers'): the reply names
the failure and a request id; the whole failure, URL and all, is in the server's log."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.model_failures import withheld
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

BASE_URL = "http://llm-gateway.corp.internal:8443/v1"
HOST = "llm-gateway.corp.internal"
_PORT = re.compile(r"(?<!\d)8443(?!\d)")
"""The endpoint's port as a number of its own: a dumped event's timestamp may hold the digits
(02:38:46.584430Z failed a clean-clone run that looked for "8443")."""


def names_internal(text: str) -> list[str]:
    """What of the endpoint's host, port, address and URL ``text`` shows."""
    return [part for part in (HOST, "10.20.30.40", "http://") if part in text] + _PORT.findall(text)


STEP = {"action": "process_step", "session_id": "s-1", "step_name": "greet", "input_data": {"m": "hi"}}


def _refuse_503(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        503, json={"error": {"message": "The server is overloaded", "type": "server_error"}}
    )


def _refuse_404_route(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, content=b"404 page not found")


def _connection_refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError(
        f"Cannot connect to host {HOST}:8443 ssl:default [Connect call failed ('10.20.30.40', 8443)]"
    )


def _redirect(request: httpx.Request) -> httpx.Response:
    return httpx.Response(307, headers={"location": "http://10.20.30.40:9000/v1/chat/completions"})


def served(handler: object) -> Iterator[tuple[TestClient, Engine]]:
    """An API whose model endpoint, at an internal URL, answers every call with ``handler``."""

    async def no_sleep(seconds: float) -> None:
        return None

    engine = Engine(settings=make_settings(database_url="memory:"))
    config = ClientConfig(base_url=BASE_URL, api_key=ApiKey("sk-test-secret-1"), default_model="gpt-4.1")
    engine.llm = OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(handler),  # type: ignore[arg-type]
        retry_sleep=no_sleep,
    )
    engine.start_session("s-1", "customer_service")
    with TestClient(create_app(engine, require_keys=False)) as test_client:
        yield test_client, engine
    engine.close()


@pytest.mark.parametrize(
    "handler",
    [_refuse_503, _refuse_404_route, _connection_refused, _redirect],
    ids=["503", "404-route", "connection-refused", "redirect"],
)
@pytest.mark.parametrize("path", ["webhook", "rest"])
def test_a_failed_model_call_is_told_without_the_endpoints_url_or_host(
    handler: object, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    for client, _ in served(handler):
        # When a step's model call fails
        with caplog.at_level(logging.ERROR, logger="flowledger.http.errors"):
            if path == "webhook":
                response = client.post("/webhook/workflow-state", json=STEP)
            else:
                response = client.post(
                    "/v1/sessions/s-1/process", json={"step": "greet", "input": {"m": "hi"}}
                )
        # Then the caller is told it failed, with no URL, host name or address of the endpoint
        assert response.status_code == 502
        told = response.json()["error"]
        assert not names_internal(told), told
        assert "llm-gateway" not in told, told
        assert "model call" in told
        request_id = response.headers["x-request-id"]
        assert request_id in told
        # And the server's log has the whole failure, endpoint included, under that request id
        logged = [r.getMessage() for r in caplog.records if request_id in r.getMessage()]
        assert logged, caplog.records
        assert any(HOST in line for line in logged), logged


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        (
            "circuit for http://[fd00::5]:8080/v1/chat/completions is open; next trial in 3.0s",
            "circuit for [URL withheld] is open; next trial in 3.0s",
        ),
        (
            "gpt-4.1 at https://user:***@llm.corp/v1/chat/completions: timed out: ReadTimeout('')"
            " (after 3 attempt(s))",
            "gpt-4.1: timed out: ReadTimeout('') (after 3 attempt(s))",
        ),
        (
            "gpt-4.1 at http://llm.corp/v1/chat/completions: connection failed: OSError: "
            "Multiple exceptions: [Errno 111] Connect call failed ('::1', 8080, 0, 0), llm.corp refused",
            "gpt-4.1: connection failed: OSError: Multiple exceptions: [Errno 111] Connect call failed "
            "[address withheld], [host withheld] refused",
        ),
        ("HTTP 400 invalid_request_error: Invalid 'messages[0].role': 'robot'.", None),
    ],
    ids=[
        "circuit-open-ipv6",
        "timeout-with-credentials",
        "bare-host-and-ipv6-address",
        "nothing-to-withhold",
    ],
)
def test_withheld_takes_out_urls_hosts_and_addresses_and_nothing_else(message: str, kept: str | None) -> None:
    assert withheld(message) == (message if kept is None else kept)


def test_a_sessions_failures_are_read_without_the_endpoints_url_or_host() -> None:
    for client, engine in served(_connection_refused):
        # Given a step whose model call failed
        assert client.post("/webhook/workflow-state", json=STEP).status_code == 502
        # When the session is read over REST
        [failure] = client.get("/v1/sessions/s-1").json()["failures"]
        # Then its failure names no URL, host or address (they were read as recorded)
        assert not names_internal(failure["error_message"]), failure
        assert failure["error_message"].startswith("gpt-4.1: connection failed: ConnectError")
        # And the recorded StepFailed keeps the whole message, for the operator
        assert HOST in engine.get_session("s-1").failures[0].error_message


def test_a_sessions_history_shows_its_failures_without_the_endpoints_url_or_host() -> None:
    for client, engine in served(_connection_refused):
        # Given a step whose model call failed
        assert client.post("/webhook/workflow-state", json=STEP).status_code == 502
        # When the session's history is read over REST
        events = client.get("/v1/sessions/s-1/history").json()
        # Then its StepFailed names no URL, host or address of the endpoint
        [failed] = [e for e in events if e["event_type"].endswith("StepFailed")]
        shown = json.dumps(failed)
        assert not names_internal(shown), failed
        assert failed["data"]["error_message"].startswith("gpt-4.1: connection failed: ConnectError")
        # And the stored event keeps the whole message, for the operator
        [stored] = [e for e in engine.history("s-1") if e.event_type.endswith("StepFailed")]
        assert HOST in stored.data["error_message"]


def test_a_circuit_open_failure_in_history_shows_no_endpoint_in_its_fields() -> None:
    for client, engine in served(_refuse_503):
        # Given failed calls enough to open the endpoint's circuit, and one refused by it
        threshold = engine.llm.config.breaker_failure_threshold  # type: ignore[union-attr]
        for _ in range(threshold):
            client.post("/webhook/workflow-state", json=STEP)
        assert client.post("/webhook/workflow-state", json=STEP).status_code == 503
        # When the session's history is read over REST
        events = client.get("/v1/sessions/s-1/history").json()
        # Then no failure, its fields included, names the endpoint
        details = [e["data"]["error_detail"] for e in events if e["event_type"].endswith("StepFailed")]
        assert any(detail and detail.get("error") == "CircuitOpen" for detail in details), details
        shown = json.dumps(events)
        assert not names_internal(shown), shown


def test_a_tasks_failed_classification_is_read_without_the_endpoints_url_or_host() -> None:
    for client, engine in served(_connection_refused):
        # Given a task whose classification call failed
        assert client.post("/v1/tasks", json={"task_id": "T-1", "description": "refund"}).status_code == 201
        client.post("/v1/tasks/T-1/classify", json={})
        # When the task and its history are read over REST
        task = client.get("/v1/tasks/T-1").json()
        history = client.get("/v1/tasks/T-1/history").json()
        # Then neither names the endpoint's URL, host or address
        assert task["classification_failure"]["detail"]
        for shown in (json.dumps(task), json.dumps(history)):
            assert not names_internal(shown), shown
        # And the stored event keeps the whole detail
        assert HOST in engine.get_task("T-1").classification_failure.detail  # type: ignore[union-attr]
