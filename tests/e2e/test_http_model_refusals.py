"""A model endpoint that refuses the request itself (400 context length, 404 unknown model, 413,
422) is the caller's to mend: 422 with the endpoint's reason, not a 502 that clients retry;
its credentials refused (401) or the endpoint down stays 502. The failure is recorded either way."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient
from flowledger.adapters.llm.pricing import load_price_table
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

REFUSAL = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


def engine_answering(status: int, calls: list[int]) -> Engine:
    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(status)
        return httpx.Response(status, json=REFUSAL)

    config = ClientConfig(
        base_url="http://model.test/v1",
        api_key=ApiKey("sk-test-refusals"),
        default_model="deepseek-v3.2",
        max_retries=2,
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(answer))
    return Engine(settings=make_settings(database_url="memory:"), llm=llm)


@pytest.mark.parametrize(("endpoint", "ours"), [(400, 422), (404, 422), (413, 422), (422, 422), (401, 502)])
def test_a_request_the_model_refuses_is_a_422_and_is_recorded(endpoint: int, ours: int) -> None:
    calls: list[int] = []
    with engine_answering(endpoint, calls) as engine, TestClient(create_app(engine)) as client:
        client.post("/v1/sessions", json={"session_id": "s", "workflow": "wf"})
        answer = client.post("/v1/sessions/s/process", json={"step": "summarise", "input": {"text": "long"}})
        failures = engine.get_session("s").failures

    assert answer.status_code == ours, answer.text
    assert f"HTTP {endpoint}" in answer.json()["error"]
    assert "maximum context length" in answer.json()["error"]
    assert calls == [endpoint]  # a refusal of the request is not retried
    assert [f.error_type for f in failures] == [f"http_{endpoint}"]


def test_the_webhook_answers_a_refused_request_422_too() -> None:
    calls: list[int] = []
    with engine_answering(400, calls) as engine, TestClient(create_app(engine)) as client:
        body = {"action": "process_step", "session_id": "w", "step_name": "s", "input_data": {"q": "x"}}
        created = {"action": "create_session", "session_id": "w", "workflow_name": "cs"}
        assert client.post("/webhook/workflow-state", json=created).status_code == 200
        answer = client.post("/webhook/workflow-state", json=body)

    assert answer.status_code == 422, answer.text
    assert answer.json()["success"] is False


def test_the_openapi_document_says_the_422_of_a_model_call_may_be_the_models_refusal() -> None:
    with engine_answering(400, []) as engine, TestClient(create_app(engine)) as client:
        paths = client.get("/openapi.json").json()["paths"]

    for path in ("/v1/sessions/{session_id}/process", "/webhook/workflow-state"):
        told = paths[path]["post"]["responses"]["422"]["description"]
        assert "model endpoint refused the request itself" in told, path
        assert "400, 404, 413 or 422" in told
    # An operation that calls no model keeps the plain wording
    plain = paths["/v1/sessions"]["post"]["responses"]["422"]["description"]
    assert "model" not in plain
