"""A derived deadline counts from the task's creation, so a reclassification does not push it out.

An outside probe (`flowledger serve --simulate-llm`, curl): a task created without a deadline,
classified at 12 estimated hours, got 05:09:35.9 tomorrow; each `POST .../reclassify` five
seconds apart, with the same 12 hours, moved it five seconds later (05:09:41.4, 05:09:46.8),
its derivation saying "= classified at + 2 x 12 estimated hours". The estimate is of the
task's work, asked for when it was created: the deadline now counts from the creation, a
reclassification moves it only by another estimate, the floor (an hour after the
classification, for a task classified late) never moves one derived before later, and a
deadline a person gave is never touched. The derivation names the moment it counts from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain.bounds import MIN_DERIVED_DEADLINE
from flowledger.domain.task_views import TaskState
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.clock import SetClock
from tests.support.llm import ScriptedLlm

CREATED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def clocked() -> Iterator[tuple[Engine, SetClock]]:
    clock = SetClock(CREATED)
    with Engine(settings=make_settings(database_url="memory:"), clock=clock) as engine:
        yield engine, clock


async def reclassify(engine: Engine, hours: float) -> TaskState:
    """T1 reclassified through the model (the LLM double), as a bug fix of ``hours``."""
    engine.llm = ScriptedLlm(
        json.dumps({"category": "bug_fix", "complexity": "low", "estimated_hours": hours})
    )
    return await engine.reclassify_task("T1")


def derivation(engine: Engine, task_id: str) -> str:
    data: str = engine.task_history(task_id)[-1].data["derivation"]
    return data


async def test_a_reclassification_with_the_same_estimate_keeps_the_derived_deadline(
    clocked: tuple[Engine, SetClock],
) -> None:
    engine, clock = clocked
    # Given a task created at 09:00 without a deadline, classified at 09:05 as 6 hours of work
    engine.create_task("T1", "Fix the crash in the python parser")
    clock.now = CREATED + timedelta(minutes=5)
    first = engine.record_classification("T1", "bug_fix", "low", 6.0)
    assert first.deadline == CREATED + timedelta(hours=12)
    assert f"created at {CREATED.isoformat()} + 2 x 6 estimated hours" in derivation(engine, "T1")

    # When it is reclassified twice, later, with the same estimate
    for minutes in (30, 90):
        clock.now = CREATED + timedelta(minutes=minutes)
        again = await reclassify(engine, 6.0)
        # Then the deadline stays where it was
        assert again.deadline == first.deadline

    # And another estimate moves it, still counted from the creation
    clock.now = CREATED + timedelta(hours=2)
    assert (await reclassify(engine, 10.0)).deadline == CREATED + timedelta(hours=20)


async def test_a_task_classified_late_gets_the_floor_once_and_a_reclassification_keeps_it(
    clocked: tuple[Engine, SetClock],
) -> None:
    engine, clock = clocked
    # Given a task classified 5 hours after its creation as 1 hour of work (2 h: passed already)
    engine.create_task("T1", "Fix the crash in the python parser")
    clock.now = CREATED + timedelta(hours=5)
    first = engine.record_classification("T1", "bug_fix", "low", 1.0)
    # Then it has the floor, an hour after that classification, and says why
    assert first.deadline == clock.now + MIN_DERIVED_DEADLINE
    assert "raised to 1:00:00 ahead (MIN_DERIVED_DEADLINE)" in derivation(engine, "T1")

    # When it is reclassified 40 minutes later with the same estimate
    clock.now += timedelta(minutes=40)
    again = await reclassify(engine, 1.0)
    # Then the floor does not move it later: the deadline derived before stands
    assert again.deadline == first.deadline
    assert "kept at the deadline derived before" in derivation(engine, "T1")


async def test_a_deadline_the_creator_gave_is_never_rederived(clocked: tuple[Engine, SetClock]) -> None:
    engine, clock = clocked
    engine.create_task("T1", "Fix the crash in the python parser", deadline=timedelta(hours=30))
    clock.now = CREATED + timedelta(hours=1)
    engine.record_classification("T1", "bug_fix", "low", 6.0)
    clock.now = CREATED + timedelta(hours=2)
    assert (await reclassify(engine, 1.0)).deadline == CREATED + timedelta(hours=30)
    assert "deadline" not in derivation(engine, "T1")
