"""The webhook's two modes: the seed's behaviour (default) and strict mode, on both backends.

Each test drives ``/webhook/workflow-state`` over the ASGI app, with a clock the test moves;
the model is the built-in simulator, called through the real client, which keeps what it was
asked and what it answered. Steps of the seed's flow (``intent_classification``,
``refund_handler``, ``session_complete``) get decisions with a context update; other step
names get a plain reply.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Exchange, Simulator, SimulatorConfig, run_simulator
from flowledger.domain.errors import IdempotencyKeyReused
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm
from tests.support.simulated import list_cost, simulated_client

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    """A simulator of the test's own: its exchanges are this test's calls only."""
    with run_simulator(SimulatorConfig(latency_ms=0, seed=18)) as running:
        yield running


def decision(exchange: Exchange) -> dict[str, Any]:
    """The step decision the simulator sent in ``exchange``."""
    answer: dict[str, Any] = json.loads(exchange.reply["choices"][0]["message"]["content"])
    return answer


@dataclass
class Hook:
    """The app's client, its engine, the simulator its model calls reach, and the clock."""

    http: TestClient
    engine: Engine
    simulator: Simulator
    now: list[datetime]

    def post(self, **body: Any) -> tuple[int, dict[str, Any]]:
        response = self.http.post("/webhook/workflow-state", json=body)
        return response.status_code, response.json()

    def kinds(self, session_id: str) -> list[str]:
        return [e.event_type.removeprefix("Session.") for e in self.engine.history(session_id)]

    @property
    def calls(self) -> list[Exchange]:
        """The model calls answered so far, oldest first."""
        return list(self.simulator.exchanges)


def _hook(request: pytest.FixtureRequest, strict: bool, simulator: Simulator) -> Iterator[Hook]:
    if request.param == "memory":
        settings = make_settings(database_url="memory:", webhook_strict=strict)
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"),
            schema=request.getfixturevalue("pg_schema"),
            webhook_strict=strict,
        )
    now = [START]
    engine = Engine(settings=settings, clock=lambda: now[0], llm=simulated_client(simulator.base_url))
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        yield Hook(http, engine, simulator, now)


@pytest.fixture(params=["memory", "postgres"])
def hook(request: pytest.FixtureRequest, simulator: Simulator) -> Iterator[Hook]:
    """The webhook as the server runs it by default (the seed's behaviour)."""
    yield from _hook(request, strict=False, simulator=simulator)


@pytest.fixture(params=["memory", "postgres"])
def strict_hook(request: pytest.FixtureRequest, simulator: Simulator) -> Iterator[Hook]:
    """The webhook of a server configured strict (``FLOWLEDGER_WEBHOOK_STRICT=1``)."""
    yield from _hook(request, strict=True, simulator=simulator)


def create(hook: Hook, session_id: str = "s1", **extra: Any) -> tuple[int, dict[str, Any]]:
    return hook.post(action="create_session", session_id=session_id, workflow_name="cs", **extra)


def step(hook: Hook, name: str, data: dict[str, Any], **extra: Any) -> tuple[int, dict[str, Any]]:
    return hook.post(action="process_step", session_id="s1", step_name=name, input_data=data, **extra)


def test_input_data_is_merged_before_the_model_call_and_its_update_after_each_an_event(hook: Hook) -> None:
    create(hook)
    first_input, second_input = {"intent": "refund_request", "order_id": "A1"}, {"order_id": "A2"}
    step(hook, "intent_classification", first_input, idempotency_key="k1")
    status, body = step(hook, "refund_handler", second_input)
    assert status == 200
    # The model saw the merged context: the first input, the first answer's update, then the
    # second input over them; the answer carries both merges (its refund is for A2).
    first, second = hook.calls
    seen = {**first_input, **decision(first)["context_update"], **second_input}
    assert json.loads(second.messages[1]["content"]) == seen
    assert decision(second)["context_update"] == {"refund_status": "requested", "refund_id": "RF-A2"}
    assert body["data"]["context"] == {**seen, **decision(second)["context_update"]}
    # What the call cost came through the real client: the simulator's usage at list price.
    assert body["data"]["ai_metrics"]["cost_usd"] == float(list_cost(second.reply))
    state = hook.post(action="get_state", session_id="s1")[1]["data"]
    assert state["context"] == body["data"]["context"]
    step_events = ["ContextUpdated", "StepStarted", "StepProcessed"]
    assert hook.kinds("s1") == ["Started", *step_events, *step_events]
    # A retried step (same key) merges nothing twice and calls no model.
    step(hook, "intent_classification", first_input, idempotency_key="k1")
    assert len(hook.kinds("s1")) == 7
    assert len(hook.calls) == 2
    # Replaying the session at the first merge shows the context as it was then.
    assert hook.engine.get_session("s1", version=2).context == first_input


def test_strict_mode_records_the_input_on_the_step_only(strict_hook: Hook) -> None:
    create(strict_hook)
    status, body = step(strict_hook, "intent_classification", {"message": "I want a refund"})
    # The model read the input, but only its answer's update is in the context
    first = decision(strict_hook.calls[0])["context_update"]
    assert first["intent"] == "refund_request"
    assert (status, body["data"]["context"]) == (200, first)
    assert strict_hook.kinds("s1") == ["Started", "StepStarted", "StepProcessed"]
    # A request may ask for the seed's behaviour on a strict server, and the reverse.
    step(strict_hook, "session_complete", {"order": "A2"}, strict=False)
    second = decision(strict_hook.calls[1])["context_update"]
    assert second == {"session_closed": True}
    assert strict_hook.engine.get_session("s1").context == {**first, "order": "A2", **second}


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
    step(strict_hook, "intent_classification", {"message": "Where is my order #A1001?"})
    status, body = create(strict_hook)
    assert (status, body["data"]["current_step"]) == (200, decision(strict_hook.calls[0])["next_step"])
    assert body["data"]["current_step"] == "order_status_handler"
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
        (
            {"expires_at": "2026-03-02T00:00:00"},
            "expires_at: must carry a time zone (like +00:00 or Z), got 2026-03-02T00:00:00",
        ),
        ({"expires_at": "2026-02-01T00:00:00+00:00"}, "expires_at: must lie in the future"),
        ({"expires_at": "soon"}, "expires_at: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)"),
        ({"expires_hours": -1}, "expires_hours: must be above 0"),
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
    assert hook.simulator.stats["requests"] == 0


def test_a_null_input_data_is_an_empty_one(hook: Hook) -> None:
    create(hook)
    status, body = hook.post(
        action="process_step", session_id="s1", step_name="intent_classification", input_data=None
    )
    [call] = hook.calls
    assert json.loads(call.messages[1]["content"]) == {}
    assert (status, body["data"]["context"]) == (200, decision(call)["context_update"])


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


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("input_data", "message"),
    [
        ('{"x": 1e400}', "input_data: numbers must be finite (JSON has no NaN or Infinity), got inf (at x)"),
        ('{"\\u0000": 1}', "input_data: key '\\x00' must not contain NUL characters"),
        (json.dumps({"deep": _nested(40)}), "input_data: is nested more than 32 levels deep"),
    ],
)
def test_a_bad_input_data_is_refused_under_its_own_name_in_both_modes(
    hook: Hook, strict_hook: Hook, input_data: str, message: str
) -> None:
    body = '{"action": "process_step", "session_id": "s1", "step_name": "intent_classification", '
    body += f'"input_data": {input_data}}}'
    for each in (hook, strict_hook):
        create(each)
        head = each.engine.log.head()
        response = each.http.post(
            "/webhook/workflow-state", content=body, headers={"content-type": "application/json"}
        )
        assert (response.status_code, response.json()["success"]) == (422, False)
        assert response.json()["error"].startswith(message)
        assert each.engine.log.head() == head
        assert each.calls == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"action": "create_session", "session_id": "s2", "workflow_name": "cs\n"},
            "workflow_name: must not contain control characters (found U+000A)",
        ),
        (
            {"action": "process_step", "session_id": "s1", "step_name": "greet\x1b"},
            "step_name: must not contain control characters (found U+001B)",
        ),
        (
            {"action": "process_step", "session_id": "s1", "step_name": "greet", "user_id": "u\n"},
            "user_id: must not contain control characters (found U+000A)",
        ),
    ],
)
def test_a_bad_name_is_refused_under_the_webhooks_name_for_it_in_both_modes(
    hook: Hook, strict_hook: Hook, body: dict[str, Any], message: str
) -> None:
    # Given a session of no user (a user_id it is sent is compared with none)
    for each in (hook, strict_hook):
        create(each)
        head = each.engine.log.head()
        # When a request names a workflow, a step or a user with a control character
        status, answer = each.post(**body)
        # Then it is a 422 under the webhook's own field name (workflow_name was refused as
        # "workflow", step_name as "step"; the user_id was taken), and nothing happens
        assert (status, answer) == (422, {"success": False, "error": message})
        assert each.engine.log.head() == head
        assert each.calls == []


def test_a_body_key_and_an_idempotency_key_header_that_differ_are_refused_in_both_modes(
    hook: Hook, strict_hook: Hook
) -> None:
    # docs/http.md: two different idempotency keys are a 422, as on the REST routes
    body = {"action": "process_step", "session_id": "s1", "step_name": "intent_classification"}
    for n, each in enumerate((hook, strict_hook)):
        create(each)
        head, calls = each.engine.log.head(), len(each.calls)
        response = each.http.post(
            "/webhook/workflow-state",
            json={**body, "input_data": {"q": 1}, "idempotency_key": f"K2-{n}"},
            headers={"Idempotency-Key": f"K3-{n}"},
        )
        assert (response.status_code, response.json()["success"]) == (422, False)
        assert "idempotency_key" in response.json()["error"]
        assert each.engine.log.head() == head
        assert len(each.calls) == calls
        # The same key in both places is one key
        response = each.http.post(
            "/webhook/workflow-state",
            json={**body, "input_data": {"q": 1}, "idempotency_key": f"K2-{n}"},
            headers={"Idempotency-Key": f"K2-{n}"},
        )
        assert response.status_code == 200, response.text
        assert len(each.calls) == calls + 1


@pytest.mark.parametrize("key", ["clé-1", "ключ", "€-7", "order—7"])
def test_an_idempotency_key_header_in_utf8_is_the_same_key_as_in_the_body(hook: Hook, key: str) -> None:
    # Given a key beyond ASCII, sent as UTF-8 (what clients send): it was read as Latin-1, so
    # "clé-1" was stored as "clÃ©-1" (the body's "clé-1" another key: a second model call),
    # and a key holding bytes 0x80-0x9F ("ключ", "€-7") was refused as holding control characters
    create(hook)
    body = {"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {"q": 1}}
    encoded = [("Idempotency-Key", key.encode())]
    # When the step is sent with the key in the header, then with it in the body, then in both
    first = hook.http.post("/webhook/workflow-state", json=body, headers=encoded)
    again = hook.post(**body, idempotency_key=key)
    both = hook.http.post("/webhook/workflow-state", json={**body, "idempotency_key": key}, headers=encoded)
    rest = hook.http.post(
        "/v1/sessions/s1/process", json={"step": "greet", "input": {"q": 1}}, headers=encoded
    )
    # Then it is one key, stored as sent: one model call, the same answer each time
    assert first.status_code == 200, first.text
    assert again == (200, first.json())
    assert both.json() == first.json()
    # REST's /process under the key is found to be the webhook's step (it merged its input,
    # REST's does not: another request under the same key, named as sent)
    assert rest.status_code == 422, rest.text
    assert f"idempotency key {key!r} of session 's1' already names step 'greet'" in rest.json()["error"]
    assert len(hook.calls) == 1
    assert {e.data.get("idempotency_key") for e in hook.engine.history("s1")} - {None} == {key}


@pytest.mark.parametrize("length", [201, 801, 5000])
def test_an_idempotency_key_header_over_200_characters_is_refused_saying_so(hook: Hook, length: int) -> None:
    create(hook)
    body = {"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {}}
    answer = hook.http.post("/webhook/workflow-state", json=body, headers={"Idempotency-Key": "k" * length})
    assert (answer.status_code, answer.json()["error"]) == (
        422,
        f"header.Idempotency-Key: must be at most 200 characters, got {length}",
    )
    assert hook.calls == []


def test_an_idempotency_key_header_given_twice_is_refused_naming_it_not_the_first_taken(hook: Hook) -> None:
    # Given two Idempotency-Key headers on one request (a proxy adding its own, a client
    # setting it twice): the first was taken without a word, the second dropped
    create(hook)
    twice = [("Idempotency-Key", "K1"), ("Idempotency-Key", "K2")]
    body = {"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {"q": 1}}
    head = hook.engine.log.head()
    # When it is sent to the webhook and to the REST step
    answers = [
        hook.http.post("/webhook/workflow-state", json=body, headers=twice),
        hook.http.post("/v1/sessions/s1/process", json={"step": "greet", "input": {"q": 1}}, headers=twice),
    ]
    # Then each is a 422 naming the header, and nothing is recorded or called
    for answer in answers:
        assert (answer.status_code, answer.json()) == (
            422,
            {"success": False, "error": "header.Idempotency-Key: given 2 times: it takes one value"},
        )
    assert hook.engine.log.head() == head
    assert hook.calls == []


@pytest.mark.parametrize("mode", ["seed", "strict"])
def test_a_replayed_key_answers_as_its_step_did_not_with_the_context_of_later_steps(
    hook: Hook, mode: str
) -> None:
    # Given a step under c1, then a later step under c2 that changes the context
    create(hook)
    strict = {"strict": mode == "strict"}
    first_input = {"intent": "refund_request", "order_id": "A1"}
    first = step(hook, "intent_classification", first_input, idempotency_key="c1", **strict)
    later = step(hook, "refund_handler", {"order_id": "A1"}, idempotency_key="c2", **strict)
    assert "refund_id" in later[1]["data"]["context"]
    # When the c1 request comes again, over the webhook, then over REST and the library
    again = step(hook, "intent_classification", first_input, idempotency_key="c1", **strict)
    # Then it answers exactly as the first time: the context as it stood right after that step
    assert again == first
    assert "refund_id" not in again[1]["data"]["context"]
    assert len(hook.calls) == 2
    rest = {"step": "refund_handler", "input": {"order_id": "A1"}}
    rest_first = hook.http.post("/v1/sessions/s1/process", json=rest, headers={"Idempotency-Key": "c3"})
    step(hook, "session_complete", {}, idempotency_key="c4", **strict)
    rest_again = hook.http.post("/v1/sessions/s1/process", json=rest, headers={"Idempotency-Key": "c3"})
    assert (rest_again.status_code, rest_again.json()) == (rest_first.status_code, rest_first.json())
    outcome = asyncio.run(
        hook.engine.run_step(
            "s1", "intent_classification", first_input, idempotency_key="c1", merge_input=mode == "seed"
        )
    )
    assert outcome.context == first[1]["data"]["context"]
    assert len(hook.calls) == 4


def test_a_key_with_another_model_is_refused_and_another_name_of_the_same_model_is_a_retry(
    hook: Hook,
) -> None:
    # Given a step under c1 on deepseek-v3.2 (the configured default) over the webhook, and one
    # under rest1 over REST without a model (the default)
    create(hook)
    first = step(hook, "intent_classification", {"q": 1}, idempotency_key="c1", model="deepseek-v3.2")
    rest = {"step": "greet", "input": {"q": 2}}
    rest_first = hook.http.post("/v1/sessions/s1/process", json=rest, headers={"Idempotency-Key": "rest1"})
    assert (first[0], rest_first.status_code) == (200, 201)
    head, calls = hook.engine.log.head(), len(hook.calls)
    # When the same keys come with another model, by the webhook, REST or the library
    status, refused = step(hook, "intent_classification", {"q": 1}, idempotency_key="c1", model="gpt-4.1")
    other = hook.http.post(
        "/v1/sessions/s1/process", json={**rest, "model": "gpt-4.1"}, headers={"Idempotency-Key": "rest1"}
    )
    with pytest.raises(IdempotencyKeyReused) as library:
        asyncio.run(hook.engine.process_step("s1", "greet", {"q": 2}, "gpt-4.1", "rest1"))
    # Then each is refused as another request (422), nothing recorded, no model called
    assert (status, refused["success"]) == (422, False)
    assert "with another model" in refused["error"]
    assert other.status_code == 422
    assert "with another model" in other.json()["error"]
    assert library.value.differs == "model"
    assert (hook.engine.log.head(), len(hook.calls)) == (head, calls)
    # And the default left out, or the same model under another name it is accepted by, is the
    # same request: the first answer again
    assert step(hook, "intent_classification", {"q": 1}, idempotency_key="c1") == first
    again = step(
        hook, "intent_classification", {"q": 1}, idempotency_key="c1", model="deepseek/deepseek-v3.2"
    )
    assert again == first
    named = hook.http.post(
        "/v1/sessions/s1/process",
        json={**rest, "model": "deepseek-v3.2"},
        headers={"Idempotency-Key": "rest1"},
    )
    assert named.json() == rest_first.json()
    assert (hook.engine.log.head(), len(hook.calls)) == (head, calls)


def test_ai_metrics_and_get_state_show_what_a_step_cost_and_its_tokens_with_every_billed_attempt() -> None:
    # Given a step whose first attempt was billed and failed (a stream cut after its usage
    # chunk) and whose retry answered: 100 in / 20 out and $0.0028 each, $0.0056 charged
    usage = replace(
        USAGE,
        cost_usd=Decimal("0.0028"),
        retried_cost_usd=Decimal("0.0028"),
        retried_tokens={"input_tokens": 100, "output_tokens": 20},
        attempts=2,
    )
    engine = Engine(settings=make_settings(database_url="memory:"), llm=ScriptedLlm(usage=usage))
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        create_body = {"action": "create_session", "session_id": "s1", "workflow_name": "cs"}
        assert http.post("/webhook/workflow-state", json=create_body).status_code == 200
        # When the step runs over the webhook, and the state is read back
        processed = http.post(
            "/webhook/workflow-state",
            json={"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {}},
        ).json()["data"]
        state = http.post("/webhook/workflow-state", json={"action": "get_state", "session_id": "s1"})
        # Then both say what the step cost in all, as the session's totals (and budgets) count it,
        # and ai_metrics the tokens that cost paid for (it said the answer's 120 beside $0.0056)
        assert processed["ai_metrics"]["cost_usd"] == 0.0056
        totals = engine.get_session("s1").totals
        assert processed["ai_metrics"]["tokens"] == totals.input_tokens + totals.output_tokens == 240
        assert [h["ai_cost"] for h in state.json()["data"]["history"]] == [0.0056]
        assert engine.get_session("s1").totals.cost_usd == Decimal("0.0056")


@pytest.mark.parametrize(
    ("content", "reasons", "problem"),
    [
        (
            '{"action": "classify", "mess',
            ("length",),
            "the reply was cut at the token limit (finish_reason: length)",
        ),
        ('{"action": "classify", "next_step": 5}', ("stop",), "next_step is not a non-empty string"),
    ],
    ids=["cut", "field dropped"],
)
def test_a_reply_that_is_not_the_whole_decision_says_so_over_the_webhook(
    content: str, reasons: tuple[str, ...], problem: str
) -> None:
    # Given a model whose reply is cut at the token limit, or names a field it cannot use
    usage = replace(USAGE, finish_reasons=reasons)
    engine = Engine(settings=make_settings(database_url="memory:"), llm=ScriptedLlm(content, usage=usage))
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        create_body = {"action": "create_session", "session_id": "s1", "workflow_name": "cs"}
        assert http.post("/webhook/workflow-state", json=create_body).status_code == 200
        # When the step runs over the webhook
        processed = http.post(
            "/webhook/workflow-state",
            json={"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {}},
        ).json()["data"]
    # Then its answer names the problem, as the step's recorded output does (the seed's fields
    # alone read as a plain answer: a workflow could not tell it was cut or dropped a field)
    assert problem in processed["problems"], processed


def test_a_whole_decision_over_the_webhook_has_no_problems_field() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"), llm=ScriptedLlm())
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        http.post(
            "/webhook/workflow-state",
            json={"action": "create_session", "session_id": "s1", "workflow_name": "cs"},
        )
        processed = http.post(
            "/webhook/workflow-state",
            json={"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {}},
        ).json()["data"]
    assert "problems" not in processed


def test_every_answer_of_the_webhook_is_the_shape_its_document_gives(hook: Hook) -> None:
    # The document gave the 200 an empty schema ({}): a client or a generated test could check
    # nothing of the seed's envelope. Each action's answer, in both modes' shapes, now matches it.
    document = hook.http.get("/openapi.json").json()
    answer = document["paths"]["/webhook/workflow-state"]["post"]["responses"]["200"]
    schema = {**answer["content"]["application/json"]["schema"], "components": document["components"]}
    answers = [
        create(hook),
        step(hook, "intent_classification", {"q": "refund"}),
        step(hook, "greet", {}),
        hook.post(action="extend_session", session_id="s1", expires_hours=2),
        hook.post(action="get_state", session_id="s1"),
        hook.post(action="get_state", session_id="nobody"),
        hook.post(action="no_such_action", session_id="s1"),
        create(hook),  # again: the seed's mode restarts it
    ]
    for status, body in answers:
        assert status == 200, body
        jsonschema_rs.validate(schema, body)
    # and the schema is not one that takes anything
    with pytest.raises(jsonschema_rs.ValidationError):
        jsonschema_rs.validate(schema, {"success": True, "data": {"session_id": 5}})


def test_get_state_lists_every_step_of_a_session_longer_than_the_states_window(hook: Hook) -> None:
    # Given a session of 23 steps: the state keeps a window of its 20 most recent (fewer by
    # bytes), and get_state answered from it: 16 steps of 23 through `serve`, the first 7 gone
    create(hook)
    names = [f"step-{i}" for i in range(23)]
    for i, name in enumerate(names):
        assert step(hook, name, {"i": i})[0] == 200
    # When the state is read over the webhook
    status, body = hook.post(action="get_state", session_id="s1")
    # Then its history is every step, oldest first, as the seed's step_history was
    assert status == 200
    assert [h["step"] for h in body["data"]["history"]] == names
    recorded = hook.engine.session_steps("s1")
    assert [h["timestamp"] for h in body["data"]["history"]] == [r.recorded_at.isoformat() for r in recorded]


def test_get_state_lists_a_step_too_large_for_the_states_window() -> None:
    # Given a step whose reply is 40 KB: no window keeps it, and get_state answered no step
    reply = json.dumps({"action": "respond", "message": "x" * 40_000})
    engine = Engine(settings=make_settings(database_url="memory:"), llm=ScriptedLlm(reply))
    with engine, TestClient(create_app(engine, require_keys=False)) as http:
        create_body = {"action": "create_session", "session_id": "s1", "workflow_name": "cs"}
        assert http.post("/webhook/workflow-state", json=create_body).status_code == 200
        body = {"action": "process_step", "session_id": "s1", "step_name": "greet", "input_data": {}}
        assert http.post("/webhook/workflow-state", json=body).status_code == 200
        # When the state is read over the webhook
        state = http.post("/webhook/workflow-state", json={"action": "get_state", "session_id": "s1"})
        # Then the step is in its history
        assert engine.get_session("s1").history == ()
        assert [h["step"] for h in state.json()["data"]["history"]] == ["greet"]


@pytest.mark.parametrize("key", ["", " ", "\t", "\u200b"])
@pytest.mark.parametrize("action", ["process_step", "extend_session"])
def test_an_empty_or_blank_idempotency_key_in_the_webhooks_body_is_refused_not_read_as_none(
    hook: Hook, action: str, key: str
) -> None:
    # Given a key a template gives when its variable is unset: "" was read as no key (200, a
    # fresh step and model call on every resend, or the expiry moved again), while "  " was a
    # 422 from the engine and the REST routes refused both
    create(hook)
    head, calls = hook.engine.log.head(), len(hook.calls)
    extra = {"step_name": "greet", "input_data": {"q": 1}} if action == "process_step" else {}
    # When it is sent
    status, answer = hook.post(action=action, session_id="s1", idempotency_key=key, **extra)
    # Then it is a 422 saying what a key must be, and nothing is recorded or called
    assert (status, answer["success"]) == (422, False)
    assert answer["error"].startswith("idempotency_key: must "), answer
    assert hook.engine.log.head() == head
    assert len(hook.calls) == calls


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/webhook/workflow-state",
            {"action": "process_step", "session_id": "s1", "step_name": "g", "input_data": {}},
        ),
        ("/webhook/workflow-state", {"action": "extend_session", "session_id": "s1"}),
        ("/v1/sessions/s1/steps", {"step": "g", "input": {}, "output": {}}),
        ("/v1/sessions/s1/process", {"step": "g", "input": {}}),
        ("/v1/sessions/s1/extend", {"ttl_seconds": 60}),
        ("/v1/tasks/T1/classify", {}),
        ("/v1/tasks/T1/reclassify", {}),
    ],
)
@pytest.mark.parametrize("where", ["body", "header"])
def test_an_empty_idempotency_key_is_refused_on_every_operation_that_takes_one(
    hook: Hook, path: str, body: dict[str, Any], where: str
) -> None:
    create(hook)
    head = hook.engine.log.head()
    if where == "body":
        answer = hook.http.post(path, json={**body, "idempotency_key": ""})
    else:
        answer = hook.http.post(path, json=body, headers=[("Idempotency-Key", b"")])
    assert answer.status_code == 422, answer.text
    named = "idempotency_key" if where == "body" else "header.Idempotency-Key"
    assert answer.json()["error"].startswith(f"{named}: must "), answer.text
    assert hook.engine.log.head() == head
    assert hook.calls == []
