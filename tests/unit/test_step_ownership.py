"""A step that names its user is checked against the session it loads for the step itself:
no second load, and every caller gets its own verdict, callers sharing a key too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import SessionOwnedByAnother
from flowledger.infrastructure import Engine, Settings
from tests.support.llm import ScriptedLlm

HOOK = "/webhook/workflow-state"


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")), llm=ScriptedLlm())
    engine.start_session("s1", "cs", user_id="u1")
    try:
        yield engine
    finally:
        engine.close()


def _counting_loads(engine: Engine) -> list[Any]:
    loads: list[Any] = []
    load = engine.store.load

    def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(args)
        return load(*args, **kwargs)

    engine.store.load = counted  # type: ignore[method-assign]
    return loads


def test_a_step_naming_its_sessions_user_loads_the_session_no_more_than_one_naming_none(
    engine: Engine,
) -> None:
    with TestClient(create_app(engine)) as http:
        # Given a session its writer has just taken a step on (held in the write cache)
        first = http.post(HOOK, json={"action": "process_step", "session_id": "s1", "step_name": "a"})
        assert first.status_code == 200, first.text
        loads = _counting_loads(engine)

        # When steps name the session's user, over the webhook and REST
        hook = {"action": "process_step", "session_id": "s1", "step_name": "b", "user_id": "u1"}
        assert http.post(HOOK, json=hook).status_code == 200
        assert http.post("/v1/sessions/s1/process", json={"step": "c", "user_id": "u1"}).status_code == 201
        assert http.post("/v1/sessions/s1/steps", json={"step": "d", "user_id": "u1"}).status_code == 201

    # Then none of them read the session from the store: each took the cached copy its step used
    assert loads == []


def test_a_step_naming_another_user_is_still_403_before_any_other_refusal(engine: Engine) -> None:
    with TestClient(create_app(engine)) as http:
        head = len(engine.history("s1"))
        for body in (
            {"action": "process_step", "session_id": "s1", "step_name": "b", "user_id": "u2"},
            {"action": "process_step", "session_id": "s1", "step_name": "b\u0001", "user_id": "u2"},
        ):
            refused = http.post(HOOK, json=body)
            assert (refused.status_code, refused.json()["success"]) == (403, False), refused.text
            assert refused.json()["error"] == (
                "this session belongs to another user: the request's user_id does not match"
            )
        for path, body, status in (
            ("/v1/sessions/s1/process", {"step": "c", "user_id": "u2"}, 403),
            ("/v1/sessions/s1/steps", {"step": "d", "user_id": "u2"}, 403),
            # REST's body schema refuses a step name first, as it did
            ("/v1/sessions/s1/process", {"step": "c\u0001", "user_id": "u2"}, 422),
            ("/v1/sessions/s1/steps", {"step": "d\u0001", "user_id": "u2"}, 422),
        ):
            assert http.post(path, json=body).status_code == status, (path, body)
        missing = http.post(
            HOOK,
            json={"action": "process_step", "session_id": "nope", "step_name": "b\u0001", "user_id": "u2"},
        )
        assert missing.status_code == 404, missing.text
    assert len(engine.history("s1")) == head  # nothing appended


@pytest.mark.parametrize("owner_leads", [True, False])
def test_callers_sharing_a_key_each_get_their_own_ownership_verdict(
    engine: Engine, owner_leads: bool
) -> None:
    # Given a model call that waits until both callers are in
    gate = asyncio.Event()
    engine.llm = ScriptedLlm(gate=gate)

    async def both() -> list[Any]:
        def step(user: str) -> Any:
            return engine.run_step("s1", "a", {"q": 1}, idempotency_key="k1", user_id=user)

        order = ["u1", "u2"] if owner_leads else ["u2", "u1"]
        first = asyncio.ensure_future(step(order[0]))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(step(order[1]))
        await asyncio.sleep(0.05)
        gate.set()
        answers = await asyncio.gather(first, second, return_exceptions=True)
        return answers if owner_leads else answers[::-1]

    # When the session's user and another user send the same step under one key, concurrently
    owner, other = asyncio.run(both())

    # Then the owner has the step, the other its refusal, whoever led
    assert not isinstance(owner, BaseException), owner
    assert owner.record.step == "a"
    assert isinstance(other, SessionOwnedByAnother)
    assert [e.event_type for e in engine.history("s1")].count("Session.StepProcessed") == 1
