"""The HTTP API: the seed's webhook protocol unchanged, the REST API, and its errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.ports import LlmReply
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


class ScriptedModel:
    """An LlmPort that answers every step with the same decision, and counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        self.calls += 1
        content = json.dumps(
            {
                "action": "continue",
                "context_update": {"intent": "refund"},
                "next_step": "resolve",
                "message": "Let me check that order.",
            }
        )
        return LlmReply(
            content=content,
            usage=LlmUsage(
                provider="scripted",
                request_model=model or "deepseek-v3.2",
                response_model=model or "deepseek-v3.2",
                input_tokens=900,
                output_tokens=100,
                cost_usd=Decimal("0.00042"),
                latency_ms=45.0,
            ),
        )


@pytest.fixture(params=["memory", "postgres"])
def client(request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, ScriptedModel]]:
    model = ScriptedModel()
    if request.param == "memory":
        settings = make_settings(database_url="memory:")
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"), schema=request.getfixturevalue("pg_schema")
        )
    engine = Engine(settings=settings, llm=model)
    with TestClient(create_app(engine)) as test_client:
        yield test_client, model
    engine.close()


def webhook(client: TestClient, **body: Any) -> tuple[int, dict[str, Any]]:
    response = client.post("/webhook/workflow-state", json=body)
    return response.status_code, response.json()


def test_the_seed_webhook_creates_processes_and_reads_a_session(
    client: tuple[TestClient, ScriptedModel],
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
        input_data={"message": "late order"},
        model="deepseek-v3.2",
    )
    assert status == 200
    data = processed["data"]
    assert data["step"] == "classify_intent"
    assert data["next_step"] == "resolve"
    assert data["action"] == "continue"
    assert data["message"] == "Let me check that order."
    assert data["context"]["intent"] == "refund"
    assert data["ai_metrics"] == {
        "model": "deepseek-v3.2",
        "tokens": 1000,
        "cost_usd": 0.00042,
        "latency_ms": 45,
    }

    status, state = webhook(http, action="get_state", session_id="user-1-1700000000")
    assert status == 200
    assert state["data"]["current_step"] == "resolve"
    assert [h["step"] for h in state["data"]["history"]] == ["classify_intent"]
    assert state["data"]["history"][0]["ai_cost"] == 0.00042
    assert model.calls == 1


def test_the_webhook_answers_errors_in_the_seed_envelope(client: tuple[TestClient, ScriptedModel]) -> None:
    http, model = client
    assert webhook(http, action="explode", session_id="s") == (
        400,
        {"success": False, "error": "Unknown action: explode"},
    )
    status, body = webhook(http, action="process_step", session_id="ghost", step_name="x")
    assert (status, body["success"]) == (404, False)
    assert "ghost" in body["error"]
    status, body = webhook(http, action="create_session", session_id="s1")
    assert (status, body) == (422, {"success": False, "error": "workflow_name: is required for this action"})
    assert webhook(http, action="get_state", session_id="ghost") == (
        200,
        {"success": True, "data": {"context": None, "current_step": None, "history": []}},
    )
    assert model.calls == 0


def test_the_rest_api_records_steps_idempotently_and_replays(
    client: tuple[TestClient, ScriptedModel],
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
    again = http.post(
        "/v1/sessions/r1/steps",
        json={**step, "output": {"text": "changed"}},
        headers={"Idempotency-Key": "k1"},
    )
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()

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
    client: tuple[TestClient, ScriptedModel], path: str, body: dict[str, Any], status: int
) -> None:
    http, _ = client
    http.post("/v1/sessions", json={"session_id": "r2", "workflow": "cs"})
    response = http.post(path, json=body)
    assert response.status_code == status
    assert response.json()["success"] is False
    assert response.json()["error"]
    assert len(http.get("/v1/sessions/r2/history").json()) == 1


def test_a_closed_session_or_another_workflow_is_a_conflict(
    client: tuple[TestClient, ScriptedModel],
) -> None:
    http, _ = client
    http.post("/v1/sessions", json={"session_id": "c1", "workflow": "cs"})
    assert http.post("/v1/sessions/c1/complete", json={"resolution": "done"}).status_code == 200
    assert http.post("/v1/sessions/c1/steps", json={"step": "late"}).status_code == 409
    assert http.post("/v1/sessions", json={"session_id": "c1", "workflow": "other"}).status_code == 409


def test_the_openapi_schema_lists_the_webhook_and_the_rest_api(
    client: tuple[TestClient, ScriptedModel],
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
