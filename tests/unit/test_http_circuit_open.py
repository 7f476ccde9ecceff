"""A step refused by the model endpoint's open circuit is a 503 that says when to come back
(``Retry-After``, from ``CircuitOpen.retry_in_s``), on the webhook and over REST alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.errors import headers_for
from flowledger.domain.errors import CircuitOpen
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm

ENDPOINT = "http://llm.test/v1/chat/completions"


@pytest.fixture
def client() -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.llm = ScriptedLlm(error=CircuitOpen(ENDPOINT, retry_in_s=12.2))
    engine.start_session("s-1", "customer_service")
    with TestClient(create_app(engine, require_keys=False)) as test_client:
        yield test_client
    engine.close()


def test_the_webhook_says_when_an_open_circuit_may_take_a_step_again(client: TestClient) -> None:
    # It answered 503 with no Retry-After: a caller retried at once, into the same open circuit.
    body = {"action": "process_step", "session_id": "s-1", "step_name": "greet", "input_data": {"m": "hi"}}
    response = client.post("/webhook/workflow-state", json=body)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "13"
    # naming the circuit, not the endpoint's URL (the server's log has it)
    told = response.json()["error"]
    assert "circuit for [URL withheld] is open" in told
    assert "llm.test" not in told


def test_rest_says_it_too(client: TestClient) -> None:
    response = client.post("/v1/sessions/s-1/process", json={"step": "greet", "input": {"m": "hi"}})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "13"


def test_a_circuit_due_to_close_now_still_asks_for_a_second() -> None:
    assert headers_for(CircuitOpen(ENDPOINT, retry_in_s=0.0)) == {"Retry-After": "1"}
    assert headers_for(CircuitOpen(ENDPOINT, retry_in_s=-3.0)) == {"Retry-After": "1"}
