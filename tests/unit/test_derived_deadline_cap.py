"""A deadline derived from a classification (the catalogue's deadline_factor x the estimated
hours) is capped at MAX_DEADLINE, the bound every given deadline has, and its reason says so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from flowledger.domain.bounds import MAX_DEADLINE
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task_views import Classification, TaskPriority
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SHIPPED = json.loads((Path(__file__).parents[2] / "infrastructure" / "skills.json").read_text())


def catalogue(factor: float) -> SkillCatalogue:
    return SkillCatalogue.from_data({**SHIPPED, "deadline_factor": factor})


def derive(factor: float, hours: float) -> tuple[datetime | None, str]:
    derivation = catalogue(factor).derive(
        Classification(category="research", complexity="low", estimated_hours=hours),
        description="Survey the field",
        creator_skills=(),
        creator_priority=TaskPriority.LOW,
        creator_deadline=None,
        now=NOW,
    )
    return derivation.deadline, derivation.reason


def test_a_derived_deadline_beyond_the_bound_is_capped_and_says_so() -> None:
    # 100 x 10,000 estimated hours is about 114 years; a deadline may lie at most ~10 ahead
    deadline, reason = derive(100, 10_000)
    assert deadline == NOW + MAX_DEADLINE
    assert "capped at 3,660 days ahead" in reason
    assert "100 x 10000 estimated hours" in reason


def test_a_derived_deadline_within_the_bound_is_not_capped() -> None:
    deadline, reason = derive(2, 6)
    assert deadline == NOW + timedelta(hours=12)
    assert "capped" not in reason
    # Exactly at the bound (10 x 8,784 hours = 3,660 days) is within it
    deadline, reason = derive(10, 8784)
    assert deadline == NOW + MAX_DEADLINE
    assert "capped" not in reason


def test_a_classified_task_gets_at_most_the_bound_over_the_engine(tmp_path: Path) -> None:
    path = tmp_path / "skills.json"
    path.write_text(json.dumps({**SHIPPED, "deadline_factor": 100}))
    with Engine(settings=make_settings(database_url="memory:", skill_catalogue_file=path)) as engine:
        engine.create_task("T-1", "Survey the field", priority="low")
        task = engine.record_classification("T-1", "research", "low", 10_000)
        # (A derived deadline counts from the task's creation: tests/unit/test_reclassify_deadline.py.)
        assert task.deadline == task.created_at + MAX_DEADLINE
        assert "capped at 3,660 days ahead" in engine.task_history("T-1")[-1].data["derivation"]
