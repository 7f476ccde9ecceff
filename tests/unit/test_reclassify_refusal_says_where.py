"""A reclassification its task's status refuses says where the task stands, as a release, start,
complete or requeue does: "cannot reclassify task 'T-1': it is completed" left out by whom, and
an escalated task's "it is escalated" that no agent holds it."""

from __future__ import annotations

import json

import pytest

from flowledger.domain.errors import TaskTransitionRejected
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def classifier() -> ScriptedLlm:
    return ScriptedLlm(json.dumps({"category": "bug_fix", "complexity": "low", "estimated_hours": 1}))


async def test_reclassifying_a_completed_task_names_who_completed_it(engine: Engine) -> None:
    # Given a task completed by an agent on its first assignment
    engine.llm = classifier()
    engine.register_agent("a-1", "A", ["python"])
    engine.create_task("T-1", "Fix the Python client", ["python"])
    engine.assign_task("T-1")
    engine.complete_task("T-1", "done")
    version = engine.get_task("T-1").version

    # When it is reclassified
    with pytest.raises(TaskTransitionRejected) as refused:
        await engine.reclassify_task("T-1")

    # Then the refusal says where it stands, and nothing was recorded
    assert (
        str(refused.value) == "cannot reclassify task 'T-1': it is completed by agent 'a-1' on assignment 1"
    )
    assert engine.get_task("T-1").version == version


async def test_reclassifying_an_escalated_task_says_no_agent_holds_it(engine: Engine) -> None:
    # Given a task escalated for want of an agent with its skills
    engine.llm = classifier()
    engine.register_agent("a-1", "A", ["python"])
    engine.create_task("T-2", "Port the worker to COBOL", ["cobol"])
    engine.assign_task("T-2")

    # When it is reclassified
    with pytest.raises(TaskTransitionRejected) as refused:
        await engine.reclassify_task("T-2")

    # Then the refusal says that no agent holds it
    assert str(refused.value) == "cannot reclassify task 'T-2': it is escalated (no agent holds it)"
