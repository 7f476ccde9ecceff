"""A 404 from the model endpoint is the caller's only when it names the model: one for a route
the endpoint does not have (a base URL without ``/v1``, a proxy's missing route) is this
server's misconfiguration, a 502 telling the operator to check the base URL."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient
from flowledger.adapters.llm.pricing import load_price_table
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

MODEL_NOT_FOUND = (
    b'{"error": {"message": "The model `gpt-9` does not exist or you do not have access to it.",'
    b' "type": "invalid_request_error", "param": null, "code": "model_not_found"}}'
)


def engine_answering_404(body: bytes, base_url: str = "http://model.test/v1") -> Engine:
    config = ClientConfig(base_url=base_url, api_key=ApiKey("sk-test-404s"), max_retries=2)
    transport = httpx.MockTransport(lambda request: httpx.Response(404, content=body))
    llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=transport)
    return Engine(settings=make_settings(database_url="memory:"), llm=llm)


def process(engine: Engine) -> tuple[int, str, list[str]]:
    with TestClient(create_app(engine)) as client:
        client.post("/v1/sessions", json={"session_id": "s", "workflow": "wf"})
        answer = client.post("/v1/sessions/s/process", json={"step": "a", "input": {"q": "x"}})
        failures = [f.error_type for f in engine.get_session("s").failures]
    return answer.status_code, answer.json()["error"], failures


@pytest.mark.parametrize(
    "body",
    [
        MODEL_NOT_FOUND,
        b'{"error": "model \'gpt-9\' not found"}',
        b'{"message": "The model `gpt-9` does not exist."}',
    ],
    ids=["openai", "ollama", "vllm"],
)
def test_a_404_naming_the_model_is_the_callers_422(body: bytes) -> None:
    with engine_answering_404(body) as engine:
        status, told, failures = process(engine)
    assert (status, failures) == (422, ["http_404"]), told
    assert "HTTP 404" in told


@pytest.mark.parametrize(
    "body",
    [b"", b'{"detail": "Not Found"}', b"<html><body>404 Not Found</body></html>", b"404 page not found"],
    ids=["empty", "fastapi", "a page", "text"],
)
def test_a_404_for_the_route_is_a_502_saying_to_check_the_base_url(body: bytes) -> None:
    with engine_answering_404(body) as engine:
        status, told, failures = process(engine)
    assert (status, failures) == (502, ["endpoint_not_found"]), told
    # The caller is not told the endpoint's URL (the operator's log and the StepFailed have it)
    assert "answered 404 for its route POST [URL withheld]" in told
    assert "model.test" not in told
    assert "check the base URL" in told


def test_the_simulator_under_a_wrong_base_path_is_a_502_not_the_callers_422() -> None:
    with run_simulator(SimulatorConfig(latency_ms=0)) as simulator:
        wrong = simulator.base_url.removesuffix("/v1") + "/api"
        with engine_answering_live(wrong) as engine:
            status, told, failures = process(engine)
    assert (status, failures) == (502, ["endpoint_not_found"]), told
    assert "no route POST /api/chat/completions" in told


def engine_answering_live(base_url: str) -> Engine:
    config = ClientConfig(base_url=base_url, api_key=ApiKey("sk-simulator"), max_retries=0)
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    return Engine(settings=make_settings(database_url="memory:"), llm=llm)
