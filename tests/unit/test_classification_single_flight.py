"""Concurrent classifications of one task share one model call (issue #14: five ``classify``
calls of one task at once made five paid calls, four recorded as ``ClassificationDiscarded``).

In one engine the first caller leads and later ones wait for its outcome
(``TaskClassifier``'s in-flight registry); two engines on one database are in
tests/integration/test_classification_across_engines.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from flowledger.domain.errors import StoreUnavailable
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

FEATURE = json.dumps({"category": "feature", "complexity": "high", "estimated_hours": 6})
DOCS = json.dumps({"category": "documentation", "complexity": "low", "estimated_hours": 1})


def event_names(engine: Engine, task_id: str) -> list[str]:
    return [event.event_type.split(".")[-1] for event in engine.task_history(task_id)]


async def test_five_classifications_of_one_task_at_once_make_one_model_call(engine: Engine) -> None:
    # Given a task and a model that takes a while to answer
    engine.llm = llm = ScriptedLlm(FEATURE, delay=0.05)
    engine.create_task("t1", "Add OAuth login", [])

    # When five callers classify it at once, some naming a model
    states = await asyncio.gather(
        *(engine.classify_task("t1", model="deepseek-v3.2" if n % 2 else None) for n in range(5))
    )

    # Then the model was called once, every caller got the same task, and nothing was discarded
    assert len(llm.calls) == 1
    assert all(state == states[0] for state in states)
    assert states[0].classification is not None
    assert states[0].classification.category == "feature"
    assert event_names(engine, "t1") == ["Created", "Classified"]


async def test_callers_that_wait_for_a_failing_call_share_its_failures(engine: Engine) -> None:
    # Given a model whose answer is no classification (so the fallback is tried too)
    engine.llm = llm = ScriptedLlm(json.dumps({"category": "poetry"}), delay=0.05)
    engine.create_task("t1", "Write a haiku", [], priority="low")

    # When three callers classify it at once
    states = await asyncio.gather(*(engine.classify_task("t1") for _ in range(3)))

    # Then one caller tried the tier's model and its fallback, once each; all see it waiting
    assert [call.model for call in llm.calls] == ["gemini-2.5-flash", "deepseek-v3.2"]
    assert {state.status for state in states} == {TaskStatus.PENDING}
    assert event_names(engine, "t1").count("ClassificationFailed") == 2


async def test_reclassifications_at_once_share_one_call_but_not_another_models(engine: Engine) -> None:
    # Given a classified task
    engine.llm = ScriptedLlm(DOCS)
    engine.create_task("t1", "Write the API guide", [])
    await engine.classify_task("t1")
    engine.llm = llm = ScriptedLlm(FEATURE, delay=0.05)

    # When three callers reclassify it at once on the tier's model, and one names another model
    same = [engine.reclassify_task("t1") for _ in range(3)]
    states = await asyncio.gather(*same, engine.reclassify_task("t1", model="gemini-2.5-flash"))

    # Then the three shared one call, and the one asking for another model made its own after
    assert [call.model for call in llm.calls] == ["deepseek-v3.2", "gemini-2.5-flash"]
    assert states[0] == states[1] == states[2]
    assert states[3].version > states[0].version
    assert event_names(engine, "t1") == ["Created", "Classified", "Classified", "Classified"]


async def test_a_classification_after_the_shared_one_ended_is_answered_from_the_task(
    engine: Engine,
) -> None:
    # Given a task classified by callers that shared one call
    engine.llm = llm = ScriptedLlm(FEATURE, delay=0.02)
    engine.create_task("t1", "Add OAuth login", [])
    await asyncio.gather(engine.classify_task("t1"), engine.classify_task("t1"))

    # When another caller classifies it later, and another reclassifies it
    later = await engine.classify_task("t1")
    await engine.reclassify_task("t1")

    # Then the later classify made no call (the task is classified); the reclassify made one
    assert later.classification is not None
    assert len(llm.calls) == 2


async def test_waiters_take_over_when_the_leading_caller_is_cancelled(engine: Engine) -> None:
    # Given a caller classifying a task on a model that holds the call open
    gate = asyncio.Event()
    engine.llm = llm = ScriptedLlm(FEATURE, gate=gate)
    engine.create_task("t1", "Add OAuth login", [])
    leader = asyncio.create_task(engine.classify_task("t1"))
    while not llm.calls:
        await asyncio.sleep(0)
    waiter = asyncio.create_task(engine.classify_task("t1"))
    await asyncio.sleep(0.01)

    # When the leading caller is cancelled while the other waits for it
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    gate.set()
    state = await waiter

    # Then the waiter classified the task itself
    assert len(llm.calls) == 2
    assert state.classification is not None
    assert event_names(engine, "t1") == ["Created", "Classified"]


async def test_an_error_of_the_leading_caller_reaches_the_callers_sharing_its_call(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store that is down when the answer is to be written
    engine.llm = llm = ScriptedLlm(FEATURE, delay=0.05)
    engine.create_task("t1", "Add OAuth login", [])

    def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("save", "the test took it down")

    monkeypatch.setattr(engine.classifier, "_write", down)

    # When two callers classify the task at once
    outcomes = await asyncio.gather(
        engine.classify_task("t1"), engine.classify_task("t1"), return_exceptions=True
    )

    # Then both are told, and the model was called once
    assert [type(outcome) for outcome in outcomes] == [StoreUnavailable, StoreUnavailable]
    assert len(llm.calls) == 1
