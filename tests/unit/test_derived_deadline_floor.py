"""A deadline derived from a tiny estimate leaves the queue time to assign the task.

An outside probe: a model (or caller) that estimated a task at 1e-9 hours gave it a derived
deadline of ``classified at + 2 x 1e-9 hours``, which a duration rounds to the microsecond the
task was classified at: the next assignment found the deadline passed and escalated the task
(``deadline_breached``) with a free, capable agent waiting. A derived deadline now lies at
least ``MIN_DERIVED_DEADLINE`` (one hour, the seed's smallest ``deadline_hours``) ahead, and
its reason says when it was raised; a deadline a person gives is taken as given.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flowledger.domain.bounds import MIN_DERIVED_DEADLINE
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task_views import Classification, TaskPriority
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SHIPPED = json.loads((Path(__file__).parents[2] / "infrastructure" / "skills.json").read_text())


def derive(hours: float, factor: float = 2.0) -> tuple[datetime | None, str]:
    derivation = SkillCatalogue.from_data({**SHIPPED, "deadline_factor": factor}).derive(
        Classification(category="bug_fix", complexity="low", estimated_hours=hours),
        description="Fix the crash in the python parser",
        creator_skills=(),
        creator_priority=TaskPriority.LOW,
        creator_deadline=None,
        now=NOW,
    )
    return derivation.deadline, derivation.reason


@pytest.mark.parametrize("hours", [1e-300, 1e-9, 1e-4, 0.25])
def test_a_tiny_estimate_derives_a_deadline_no_sooner_than_the_floor_and_says_so(hours: float) -> None:
    deadline, reason = derive(hours)
    assert deadline == NOW + MIN_DERIVED_DEADLINE
    assert f"{hours:g} estimated hours" in reason
    assert "raised to 1:00:00 ahead (MIN_DERIVED_DEADLINE)" in reason


def test_an_estimate_past_the_floor_derives_its_own_deadline() -> None:
    deadline, reason = derive(0.5)
    assert deadline == NOW + timedelta(hours=1)
    assert "raised" not in reason
    deadline, reason = derive(3)
    assert deadline == NOW + timedelta(hours=6)
    assert "raised" not in reason


@pytest.mark.parametrize("hours", [1e-9, 1e-6])
def test_a_task_estimated_at_next_to_nothing_is_assigned_not_escalated(hours: float) -> None:
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        # Given a free agent who can do the task
        engine.register_agent("a1", "Ann", skills=["python"], capacity=3)
        engine.create_task("t1", "Fix the crash in the python parser")
        # When the task is classified with a tiny estimate, and then assigned
        before = engine.clock()
        classified = engine.record_classification("t1", "bug_fix", "low", hours)
        assigned = engine.assign_task("t1")
        # Then it goes to the agent, with an hour at least to do it
        assert classified.deadline is not None
        assert classified.deadline >= before + MIN_DERIVED_DEADLINE
        assert assigned.status == "assigned", assigned.escalation
        assert assigned.agent_id == "a1"
        assert engine.escalate_overdue() == []
