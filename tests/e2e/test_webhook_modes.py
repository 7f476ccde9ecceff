"""The webhook's two modes: the seed's behaviour (default) and strict mode, on both backends.

Each test drives ``/webhook/workflow-state`` over the ASGI app, with a clock the test moves
and a scripted model that records what it was asked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.ports import LlmReply
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class ScriptedModel:
    """Answers every step with ``context_update`` ``{"answered": <step>}`` and keeps the prompts."""

    prompts: list[list[dict[str, Any]]] = field(default_factory=list)

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        self.prompts.append(messages)
        step = messages[0]["content"].split("Current step: ")[1].split("\n")[0]
        decision = {"action": "go", "context_update": {"answered": step}, "next_step": f"after_{step}"}
        usage = LlmUsage(provider="script", request_model=model or "m", input_tokens=10, output_tokens=3)
        return LlmReply(content=json.dumps(decision), usage=usage)


@dataclass
class Hook:
    """The app's client, its engine, the model and the clock."""

    http: TestClient
    engine: Engine
    model: ScriptedModel
    now: list[datetime]

    def post(self, **body: Any) -> tuple[int, dict[str, Any]]:
        response = self.http.post("/webhook/workflow-state", json=body)
        return response.status_code, response.json()

    def kinds(self, session_id: str) -> list[str]:
        return [e.event_type.removeprefix("Session.") for e in self.engine.history(session_id)]


def _hook(request: pytest.FixtureRequest, strict: bool) -> Iterator[Hook]:
    if request.param == "memory":
        settings = make_settings(database_url="memory:", webhook_strict=strict)
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"),
            schema=request.getfixturevalue("pg_schema"),
            webhook_strict=strict,
        )
    now = [START]
    model = ScriptedModel()
    engine = Engine(settings=settings, clock=lambda: now[0], llm=model)
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        yield Hook(http, engine, model, now)


@pytest.fixture(params=["memory", "postgres"])
def hook(request: pytest.FixtureRequest) -> Iterator[Hook]:
    """The webhook as the server runs it by default (the seed's behaviour)."""
    yield from _hook(request, strict=False)


@pytest.fixture(params=["memory", "postgres"])
def strict_hook(request: pytest.FixtureRequest) -> Iterator[Hook]:
    """The webhook of a server configured strict (``FLOWLEDGER_WEBHOOK_STRICT=1``)."""
    yield from _hook(request, strict=True)


def create(hook: Hook, session_id: str = "s1", **extra: Any) -> tuple[int, dict[str, Any]]:
    return hook.post(action="create_session", session_id=session_id, workflow_name="cs", **extra)


def step(hook: Hook, name: str, data: dict[str, Any], **extra: Any) -> tuple[int, dict[str, Any]]:
    return hook.post(action="process_step", session_id="s1", step_name=name, input_data=data, **extra)


def test_input_data_is_merged_before_the_model_call_and_its_update_after_each_an_event(hook: Hook) -> None:
    create(hook)
    step(hook, "one", {"intent": "refund", "order": "A1"}, idempotency_key="k1")
    status, body = step(hook, "two", {"order": "A2"})
    assert status == 200
    # The model saw the merged context; the answer carries both merges.
    assert json.loads(hook.model.prompts[1][1]["content"]) == {
        "intent": "refund",
        "order": "A2",
        "answered": "one",
    }
    assert body["data"]["context"] == {"intent": "refund", "order": "A2", "answered": "two"}
    state = hook.post(action="get_state", session_id="s1")[1]["data"]
    assert state["context"] == body["data"]["context"]
    step_events = ["ContextUpdated", "StepStarted", "StepProcessed"]
    assert hook.kinds("s1") == ["Started", *step_events, *step_events]
    # A retried step (same key) merges nothing twice and calls no model.
    step(hook, "one", {"intent": "refund", "order": "A1"}, idempotency_key="k1")
    assert len(hook.kinds("s1")) == 7
    assert len(hook.model.prompts) == 2
    # Replaying the session at the first merge shows the context as it was then.
    assert hook.engine.get_session("s1", version=2).context == {"intent": "refund", "order": "A1"}


def test_strict_mode_records_the_input_on_the_step_only(strict_hook: Hook) -> None:
    create(strict_hook)
    status, body = step(strict_hook, "one", {"intent": "refund"})
    assert (status, body["data"]["context"]) == (200, {"answered": "one"})
    assert strict_hook.kinds("s1") == ["Started", "StepStarted", "StepProcessed"]
    # A request may ask for the seed's behaviour on a strict server, and the reverse.
    step(strict_hook, "two", {"order": "A2"}, strict=False)
    assert strict_hook.engine.get_session("s1").context == {"answered": "two", "order": "A2"}


def test_create_session_on_an_expired_session_restarts_it_with_a_new_expiry(hook: Hook) -> None:
    create(hook, expires_hours=1)
    step(hook, "one", {"a": 1})
    hook.now[0] += timedelta(hours=2)
    status, body = step(hook, "two", {})
    assert status == 410
    assert "expired" in body["error"]

    status, body = create(hook, expires_hours=5)
    assert status == 200
    assert body["data"] | {"id": None} == {
        "id": None,
        "session_id": "s1",
        "current_step": "init",
        "expires_at": (hook.now[0] + timedelta(hours=5)).isoformat(),
        "created": False,
        "restarted": True,
        "reopened": True,
    }
    assert hook.kinds("s1")[-2:] == ["Expired", "Restarted"]
    assert step(hook, "two", {})[0] == 200
    assert [r.step for r in hook.engine.get_session("s1").history] == ["one", "two"]


def test_create_session_on_a_live_session_keeps_its_expiry(hook: Hook) -> None:
    first = create(hook, expires_hours=3)[1]["data"]
    again = create(hook, expires_hours=100)[1]["data"]
    assert again["expires_at"] == first["expires_at"]
    assert (again["restarted"], again["reopened"]) == (True, False)


def test_create_session_is_refused_for_another_workflow_user_or_a_closed_session(hook: Hook) -> None:
    create(hook, user_id="u1")
    hook.engine.complete_session("s1", "done")
    create(hook, "s2", user_id="u1")
    head = hook.engine.log.head()
    for session_id, body, status, words in [
        ("s2", {"user_id": "u2"}, 409, "already exists"),
        ("s2", {"workflow_name": "other"}, 409, "already exists"),
        ("s1", {}, 409, "is completed"),
    ]:
        got, answer = hook.post(
            action="create_session", session_id=session_id, **{"workflow_name": "cs", **body}
        )
        assert (got, answer["success"]) == (status, False)
        assert words in answer["error"]
    assert hook.engine.log.head() == head


def test_strict_mode_answers_a_repeated_create_session_with_the_session_as_it_stands(
    strict_hook: Hook,
) -> None:
    create(strict_hook)
    step(strict_hook, "one", {})
    status, body = create(strict_hook)
    assert (status, body["data"]["current_step"]) == (200, "after_one")
    assert create(strict_hook, user_id="u9")[0] == 409
    assert strict_hook.kinds("s1") == ["Started", "StepStarted", "StepProcessed"]


def test_extend_session_adds_to_the_current_expiry_and_says_so(hook: Hook) -> None:
    create(hook, expires_hours=24)
    status, body = hook.post(action="extend_session", session_id="s1", expires_hours=2)
    assert status == 200
    data = body["data"]
    expected = START + timedelta(hours=26)
    assert data == {
        "session_id": "s1",
        "expires_at": expected.isoformat(),
        "previous_expires_at": (START + timedelta(hours=24)).isoformat(),
        "reopened": False,
        "message": f"session 's1' now expires at {expected.isoformat()} "
        f"(2 h added; it was {(START + timedelta(hours=24)).isoformat()})",
    }
    moment = START + timedelta(hours=3)
    status, body = hook.post(action="extend_session", session_id="s1", expires_at=moment.isoformat())
    assert (status, body["data"]["expires_at"]) == (200, moment.isoformat())
    assert hook.engine.get_session("s1").expires_at == moment
    assert hook.kinds("s1") == ["Started", "Extended", "Extended"]


def test_extend_session_reopens_an_expired_session_unless_strict(hook: Hook) -> None:
    create(hook, expires_hours=1)
    hook.now[0] += timedelta(hours=3)
    status, body = hook.post(action="extend_session", session_id="s1", expires_hours=4, strict=True)
    assert (status, body["success"]) == (410, False)
    status, body = hook.post(action="extend_session", session_id="s1", expires_hours=4)
    assert status == 200
    assert body["data"]["reopened"] is True
    assert body["data"]["expires_at"] == (hook.now[0] + timedelta(hours=4)).isoformat()
    assert "it had expired" in body["data"]["message"]
    assert hook.kinds("s1") == ["Started", "Expired", "Reopened"]
    assert step(hook, "late", {})[0] == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"expires_hours": 1, "expires_at": "2026-03-02T00:00:00+00:00"}, "not both"),
        ({"expires_at": "2026-03-02T00:00:00"}, "expires_at: must be a timezone-aware datetime"),
        ({"expires_at": "2026-02-01T00:00:00+00:00"}, "expires_at: must lie in the future"),
        ({"expires_at": "soon"}, "expires_at: Input should be a valid datetime"),
        ({"expires_hours": -1}, "expires_hours: Input should be greater than 0"),
    ],
)
def test_a_bad_extension_is_a_422_with_a_message_and_appends_nothing(
    hook: Hook, body: dict[str, Any], message: str
) -> None:
    create(hook)
    head = hook.engine.log.head()
    status, answer = hook.post(action="extend_session", session_id="s1", **body)
    assert (status, answer["success"]) == (422, False)
    assert message in answer["error"]
    assert hook.engine.log.head() == head


def test_an_unknown_action_gets_the_seeds_answer_or_a_400_in_strict_mode(
    hook: Hook, strict_hook: Hook
) -> None:
    seed = {"success": True, "data": {"error": "Unknown action: delete_session"}}
    assert hook.post(action="delete_session") == (200, seed)
    refused = (400, {"success": False, "error": "Unknown action: delete_session"})
    assert strict_hook.post(action="delete_session") == refused
    assert hook.post(action="delete_session", strict=True) == refused
    assert strict_hook.post(action="delete_session", strict=False) == (200, seed)
    assert hook.engine.log.head() == strict_hook.engine.log.head() == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "body: is not valid JSON (Expecting property name enclosed in double quotes, "
         "at character 1)"),
        ('["process_step"]', "body: must be a JSON object"),
        ('{"session_id": "s1"}', "action: is required"),
        ('{"action": "process_step", "session_id": "s1"}', "step_name: is required for process_step"),
        ('{"action": "process_step", "session_id": "s1", "step_name": "a", "input_data": "x"}',
         "input_data: must be a JSON object (got 'x')"),
        ('{"action": "create_session", "session_id": "s9"}', "workflow_name: is required for create_session"),
        ('{"action": "extend_session", "session_id": "nobody"}', "session 'nobody' not found"),
    ],
)  # fmt: skip
def test_bad_input_is_a_4xx_with_a_message_a_person_reads_and_appends_nothing(
    hook: Hook, content: str, message: str
) -> None:
    create(hook)
    head = hook.engine.log.head()
    response = hook.http.post(
        "/webhook/workflow-state", content=content, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert response.json() == {"success": False, "error": message}
    assert hook.engine.log.head() == head
    assert hook.model.prompts == []


def test_a_null_input_data_is_an_empty_one(hook: Hook) -> None:
    create(hook)
    status, body = hook.post(action="process_step", session_id="s1", step_name="one", input_data=None)
    assert (status, body["data"]["context"]) == (200, {"answered": "one"})


def test_the_rest_api_extends_by_a_duration_or_to_a_moment(hook: Hook) -> None:
    create(hook, expires_hours=1)
    by = hook.http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 3600})
    assert by.status_code == 200
    assert datetime.fromisoformat(by.json()["expires_at"]) == START + timedelta(hours=2)
    moment = START + timedelta(minutes=30)
    to = hook.http.post("/v1/sessions/s1/extend", json={"expires_at": moment.isoformat()})
    assert to.status_code == 200
    assert datetime.fromisoformat(to.json()["expires_at"]) == moment
    both = hook.http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 1, "expires_at": moment.isoformat()})
    assert both.status_code == 422
    assert "not both" in both.json()["error"]
    assert hook.kinds("s1") == ["Started", "Extended", "Extended"]
