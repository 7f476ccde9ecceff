"""A classification call whose caller was cancelled after its adapter said what it used is kept
for its cost (``Task.ClassificationDiscarded``), as a step's cancelled call is (``StepFailed``
"cancelled"): the budgets charged it, and the task's history held nothing of it, so the cost
views counted no call. The task is otherwise as it was: not classified, and not held back (a
cancellation is not the model failing)."""

from __future__ import annotations

import asyncio

import pytest

from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from flowledger.projections.calls import call_of
from tests.support.llm import USAGE, ScriptedLlm


async def test_a_classification_cancelled_after_it_was_billed_keeps_its_usage(engine: Engine) -> None:
    # Given a task without skills, and a caller cancelled during its classification call
    engine.create_task("t1", "Fix the race in the Go worker")
    cancelled = asyncio.CancelledError()
    cancelled.usage = USAGE  # type: ignore[attr-defined]  # the LlmPort's way to say it
    engine.llm = ScriptedLlm("{}", error=cancelled)

    # When the classification is cancelled with it
    with pytest.raises(asyncio.CancelledError):
        await engine.classify_task("t1")

    # Then the call it paid for is recorded, and the task is otherwise as it was
    last = engine.task_history("t1")[-1]
    assert last.event_type == "Task.ClassificationDiscarded"
    assert last.data["reason"].startswith("cancelled during the call to ")
    events = engine.log.stream(task_uuid(engine.tenant, "t1"))
    assert [(c.step, c.usage) for c in map(call_of, events) if c is not None] == [("classification", USAGE)]
    state = engine.get_task("t1")
    assert (state.classification, state.held_back) == (None, None)


async def test_a_classification_cancelled_before_it_said_what_it_used_records_nothing(engine: Engine) -> None:
    engine.create_task("t1", "Fix the race in the Go worker")
    engine.llm = ScriptedLlm("{}", error=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await engine.classify_task("t1")
    assert [entry.event_type for entry in engine.task_history("t1")] == ["Task.Created"]
