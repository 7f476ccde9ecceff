"""A deadline a person gave when requeuing a task stands through a later classification,
as the creator's does: the estimate sets a deadline only where nobody gave one."""

from __future__ import annotations

import json
from datetime import timedelta

from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def _classifier(hours: float) -> ScriptedLlm:
    return ScriptedLlm(
        json.dumps({"category": "documentation", "complexity": "low", "estimated_hours": hours})
    )


async def test_a_reclassification_keeps_the_deadline_a_requeue_gave(engine: Engine) -> None:
    # Given a task created without a deadline, classified (the estimate set one: 2 x 1.5 h),
    # swept once that passed, and requeued by a person for a week
    engine.llm = _classifier(1.5)
    engine.register_agent("backend", "Backend", ["python"], 1)
    engine.create_task("docs", "Write the docs of the Python client", [], "low")
    await engine.classify_task("docs")
    assert [t.task_id for t in engine.escalate_overdue(engine.clock() + timedelta(days=1))] == ["docs"]
    week = engine.requeue_task("docs", "alice@example.com", "give it a week", timedelta(days=7)).deadline

    # When it is classified again
    task = await engine.reclassify_task("docs")

    # Then the person's deadline stands (it was replaced by one 3 hours ahead), and the
    # derivation says nothing of a deadline
    assert task.deadline == week
    derivation = engine.task_history("docs")[-1].data["derivation"]
    assert "deadline" not in derivation
    assert "skills python" in derivation


async def test_a_first_classification_after_a_requeue_keeps_its_deadline(engine: Engine) -> None:
    # Given a task nobody could take, escalated, then requeued with a deadline two days ahead
    engine.llm = _classifier(1.5)
    engine.register_agent("frontend", "Frontend", ["react"], 1)
    engine.create_task("ops", "Provision the VPC", ["terraform"])
    assert engine.assign_task("ops").status.value == "escalated"
    given = engine.requeue_task("ops", "bob", "DevOps joins tomorrow", timedelta(days=2)).deadline

    # When it is classified for the first time, Then the requeue's deadline stands
    assert (await engine.classify_task("ops")).deadline == given


async def test_a_task_nobody_gave_a_deadline_still_gets_one_from_the_estimate(engine: Engine) -> None:
    engine.llm = _classifier(2.0)
    engine.create_task("t", "Write the docs of the Python client", [])
    classified = await engine.classify_task("t")
    assert classified.deadline == classified.created_at + timedelta(hours=4)  # from its creation
