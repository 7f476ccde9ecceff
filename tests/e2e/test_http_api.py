"""The HTTP API: the seed's webhook protocol unchanged, the REST API, and its errors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import OpenAICompatibleClient
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.simulated import list_cost


@dataclass
class Served:
    """The engine behind the app, and the simulator its real client calls."""

    engine: Engine
    simulator: Any

    @property
    def calls(self) -> int:
        return int(self.simulator.stats["requests"])


@pytest.fixture(scope="module")
def simulator() -> Iterator[Any]:
    """The built-in OpenAI-compatible simulator on loopback (no latency, no faults)."""
    with run_simulator(SimulatorConfig(latency_ms=0, seed=5)) as running:
        yield running


@pytest.fixture(params=["memory", "postgres"])
def client(request: pytest.FixtureRequest, simulator: Any) -> Iterator[tuple[TestClient, Served]]:
    """The app over an engine whose LLM port is the real client, calling the simulator."""
    if request.param == "memory":
        settings = make_settings(database_url="memory:")
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"), schema=request.getfixturevalue("pg_schema")
        )
    settings = settings.with_overrides(llm_base_url=simulator.base_url, llm_api_key="sk-test-simulator")
    llm = OpenAICompatibleClient.from_settings(settings)
    with Engine(settings=settings, llm=llm) as engine:
        before = simulator.stats["requests"]
        simulator.stats["requests"] = 0
        try:
            with TestClient(create_app(engine)) as test_client:
                try:
                    yield test_client, Served(engine, simulator)
                finally:
                    test_client.portal.call(llm.aclose)  # the client's connections live on the app's loop
        finally:
            simulator.stats["requests"] += before


def webhook(client: TestClient, **body: Any) -> tuple[int, dict[str, Any]]:
    response = client.post("/webhook/workflow-state", json=body)
    return response.status_code, response.json()


def test_the_seed_webhook_creates_processes_and_reads_a_session(
    client: tuple[TestClient, Served],
) -> None:
    http, model = client
    status, created = webhook(
        http,
        action="create_session",
        session_id="user-1-1700000000",
        workflow_name="customer_service",
        user_id="user-1",
    )
    assert status == 200
    assert created["success"] is True
    assert created["data"]["session_id"] == "user-1-1700000000"
    assert created["data"]["current_step"] == "init"

    status, processed = webhook(
        http,
        action="process_step",
        session_id="user-1-1700000000",
        step_name="classify_intent",
        input_data={"message": "I want a refund for my late order"},
        model="deepseek-v3.2",
    )
    assert status == 200
    data = processed["data"]
    assert data["step"] == "classify_intent"
    assert data["next_step"] == "resolve"
    assert data["action"] == "classify"
    assert data["context"]["intent"] == "refund_request"
    assert data["message"] == "I understand this is about refund request."

    # The cost went through the real client's pricing: the usage the simulator sent, at the
    # model's list price (tests/support/simulated.py, typed from the provider's page).
    reply = model.simulator.exchanges[-1].reply
    expected = list_cost(reply)
    [step] = model.engine.session_steps("user-1-1700000000")
    usage = step.usage
    assert usage is not None
    assert (usage.request_model, usage.provider) == ("deepseek-v3.2", "openai_compatible")
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        reply["usage"]["prompt_tokens"],
        reply["usage"]["prompt_tokens_details"]["cached_tokens"],
        reply["usage"]["completion_tokens"],
    )
    assert usage.cost_usd == expected
    assert data["ai_metrics"] == {
        "model": "deepseek-v3.2",
        "tokens": usage.input_tokens + usage.output_tokens,
        "cost_usd": float(expected),
        "latency_ms": round(usage.latency_ms),
    }

    status, state = webhook(http, action="get_state", session_id="user-1-1700000000")
    assert status == 200
    assert state["data"]["current_step"] == "resolve"
    assert [h["step"] for h in state["data"]["history"]] == ["classify_intent"]
    assert state["data"]["history"][0]["ai_cost"] == float(expected)
    assert model.calls == 1


def test_the_webhook_answers_errors_in_the_seed_envelope(client: tuple[TestClient, Served]) -> None:
    http, model = client
    # The seed's own answer to an unknown action; strict mode refuses it with a 400.
    assert webhook(http, action="explode", session_id="s") == (
        200,
        {"success": True, "data": {"error": "Unknown action: explode"}},
    )
    assert webhook(http, action="explode", session_id="s", strict=True) == (
        400,
        {"success": False, "error": "Unknown action: explode"},
    )
    status, body = webhook(http, action="process_step", session_id="ghost", step_name="x")
    assert (status, body["success"]) == (404, False)
    assert "ghost" in body["error"]
    status, body = webhook(http, action="create_session", session_id="s1")
    assert (status, body) == (
        422,
        {"success": False, "error": "workflow_name: is required for create_session"},
    )
    assert webhook(http, action="get_state", session_id="ghost") == (
        200,
        {"success": True, "data": {"context": None, "current_step": None, "history": []}},
    )
    assert model.calls == 0


def test_the_rest_api_records_steps_idempotently_and_replays(
    client: tuple[TestClient, Served],
) -> None:
    http, _ = client
    assert http.post("/v1/sessions", json={"session_id": "r1", "workflow": "cs"}).status_code == 201
    step = {
        "step": "greet",
        "output": {"text": "hi"},
        "next_step": "classify",
        "usage": {"request_model": "gpt-4.1", "input_tokens": 10, "output_tokens": 2, "cost_usd": "0.000036"},
    }
    first = http.post("/v1/sessions/r1/steps", json=step, headers={"Idempotency-Key": "k1"})
    again = http.post("/v1/sessions/r1/steps", json=step, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    # Another payload under the key is refused (422), and records nothing
    changed = http.post(
        "/v1/sessions/r1/steps",
        json={**step, "output": {"text": "changed"}},
        headers={"Idempotency-Key": "k1"},
    )
    assert changed.status_code == 422, changed.text
    assert "idempotency key 'k1'" in changed.json()["error"]

    session = http.get("/v1/sessions/r1").json()
    assert (session["version"], session["current_step"]) == (2, "classify")
    assert session["totals"]["cost_usd"] == "0.000036"
    assert http.get("/v1/sessions/r1", params={"version": 1}).json()["current_step"] == "init"
    events = http.get("/v1/sessions/r1/history").json()
    assert [e["event_type"] for e in events] == ["Session.Started", "Session.StepProcessed"]
    assert events[1]["data"]["usage"]["cost_usd"] == "0.000036"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/sessions", {"session_id": "", "workflow": "cs"}, 422),
        ("/v1/sessions", {"session_id": "x", "workflow": "cs", "ttl_seconds": 0}, 422),
        ("/v1/sessions", {"session_id": "x", "workflow": "cs", "surprise": 1}, 422),
        ("/v1/sessions/nobody/steps", {"step": "a"}, 404),
        ("/v1/sessions/r2/steps", {"step": "a", "usage": {"input_tokens": -1}}, 422),
        ("/v1/sessions/r2/steps", {"step": " "}, 422),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message_and_append_nothing(
    client: tuple[TestClient, Served], path: str, body: dict[str, Any], status: int
) -> None:
    http, _ = client
    http.post("/v1/sessions", json={"session_id": "r2", "workflow": "cs"})
    response = http.post(path, json=body)
    assert response.status_code == status
    assert response.json()["success"] is False
    assert response.json()["error"]
    assert len(http.get("/v1/sessions/r2/history").json()) == 1


def test_a_closed_session_or_another_workflow_is_a_conflict(
    client: tuple[TestClient, Served],
) -> None:
    http, _ = client
    http.post("/v1/sessions", json={"session_id": "c1", "workflow": "cs"})
    assert http.post("/v1/sessions/c1/complete", json={"resolution": "done"}).status_code == 200
    assert http.post("/v1/sessions/c1/steps", json={"step": "late"}).status_code == 409
    assert http.post("/v1/sessions", json={"session_id": "c1", "workflow": "other"}).status_code == 409


def test_the_openapi_schema_lists_the_webhook_and_the_rest_api(
    client: tuple[TestClient, Served],
) -> None:
    http, _ = client
    paths = http.get("/openapi.json").json()["paths"]
    assert "/webhook/workflow-state" in paths
    assert "/v1/sessions/{session_id}/steps" in paths


def test_an_expired_session_is_gone() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    engine = Engine(settings=make_settings(database_url="memory:"), clock=lambda: now[0])
    with TestClient(create_app(engine)) as http:
        http.post("/v1/sessions", json={"session_id": "e1", "workflow": "cs", "ttl_seconds": 60})
        now[0] += timedelta(minutes=2)
        response = http.post("/v1/sessions/e1/steps", json={"step": "late"})
        assert response.status_code == 410
        assert "expired" in response.json()["error"]
        status, body = webhook(http, action="get_state", session_id="e1")
        assert status == 200
        assert body["data"]["current_step"] == "init"


def test_starting_a_session_again_answers_200_and_only_a_new_one_201(
    client: tuple[TestClient, Served],
) -> None:
    http, _ = client
    body = {"session_id": "n1", "workflow": "cs", "user_id": "u"}
    # When a session is started, and started again with the same workflow and user (a no-op)
    first = http.post("/v1/sessions", json=body)
    again = http.post("/v1/sessions", json=body)
    # Then only the first created it (201); the second answers the same session with 200
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert len(http.get("/v1/sessions/n1/history").json()) == 1
    # And the OpenAPI document says both
    responses = http.get("/openapi.json").json()["paths"]["/v1/sessions"]["post"]["responses"]
    assert {"200", "201"} <= set(responses)
    assert "created" in responses["201"]["description"].lower()


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        (
            "/v1/sessions",
            {"session_id": "a1", "workflow": "cs", "workflow_name": "cs"},
            ("workflow", "workflow_name"),
        ),
        ("/v1/sessions/r3/steps", {"step": "a", "step_name": "a"}, ("step", "step_name")),
        ("/v1/sessions/r3/steps", {"step": "a", "input": {}, "input_data": {}}, ("input", "input_data")),
        ("/v1/sessions/r3/process", {"step": "a", "step_name": "b"}, ("step", "step_name")),
    ],
)
def test_both_names_of_one_field_are_refused_as_one_field_given_twice(
    client: tuple[TestClient, Served], path: str, body: dict[str, Any], names: tuple[str, str]
) -> None:
    http, model = client
    http.post("/v1/sessions", json={"session_id": "r3", "workflow": "cs"})
    response = http.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "Extra inputs are not permitted" not in error
    assert f"`{names[0]}` and `{names[1]}` are one field" in error, error
    assert "only one" in error
    assert len(http.get("/v1/sessions/r3/history").json()) == 1
    assert model.calls == 0


def test_a_session_is_completed_or_abandoned_with_no_body(client: tuple[TestClient, Served]) -> None:
    http, _ = client
    http.post("/v1/sessions", json={"session_id": "b1", "workflow": "cs"})
    http.post("/v1/sessions", json={"session_id": "b2", "workflow": "cs"})
    # When each is ended with no body at all
    completed = http.post("/v1/sessions/b1/complete")
    abandoned = http.post("/v1/sessions/b2/abandon")
    # Then the library's defaults apply: an empty resolution, the reason "abandoned"
    assert completed.status_code == 200, completed.text
    assert (completed.json()["status"], completed.json()["resolution"]) == ("completed", {})
    assert abandoned.status_code == 200, abandoned.text
    assert abandoned.json()["status"] == "abandoned"
    [*_, last] = http.get("/v1/sessions/b2/history").json()
    assert last["data"]["reason"] == "abandoned"


def test_a_time_whose_plus_sign_a_url_turned_into_a_space_is_refused_saying_to_send_it_as_2b(
    memory_http: TestClient,
) -> None:
    # Given a session, and a time zone written with a bare "+" in the query (curl sends it as
    # typed; a URL query reads "+" as a space)
    memory_http.post("/v1/sessions", json={"session_id": "s-plus", "workflow": "w"})
    refused = memory_http.get("/v1/sessions/s-plus?as_of=2099-01-01T00:00:00+02:00")
    # Then the 422 says what happened to the "+" and how to send it
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error.startswith("query.as_of: "), error
    assert "'2099-01-01T00:00:00 02:00'" in error
    assert (
        "a '+' in a URL reads as a space: write the offset's + as %2B (2099-01-01T00:00:00%2B02:00)" in error
    )
    # And sent so, or with Z, the time reads
    assert memory_http.get("/v1/sessions/s-plus?as_of=2099-01-01T00:00:00%2B02:00").status_code == 200
    assert memory_http.get("/v1/sessions/s-plus?as_of=2099-01-01T00:00:00Z").status_code == 200
