"""The checks a task's commands run before deciding, as plain functions over plain values (the
engine-level tests of the same rules: test_repeated_create_validation.py, test_task_router.py,
test_failed_classification_holds_the_task.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowledger.domain.errors import TaskConflict, ValidationError
from flowledger.domain.task_checks import (
    CreationTerms,
    held_back_reason,
    require_creation,
    require_requeue_deadline,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CREATED = CreationTerms(
    task_id="t1",
    description="fix it",
    skills=("go", "python"),
    priority="high",
    deadline=T0 + timedelta(hours=4),
    created_on=T0,
)
SAME: dict[str, Any] = {"description": "fix it", "required_skills": ["Python", "go"], "priority": "HIGH"}


def test_a_new_task_comes_back_with_its_skills_and_priority_normalised() -> None:
    skills, priority = require_creation(
        tenant="t",
        task_id="t1",
        description="d",
        required_skills=["Go", "go", "python"],
        priority="High",
        deadline=None,
    )
    assert (skills, priority) == (["go", "python"], "high")


@pytest.mark.parametrize("spelled", [" high", "high ", "\tHigh\n", "  HIGH  "])
def test_a_priority_with_spaces_around_it_is_trimmed_as_skills_are(spelled: str) -> None:
    # Given a priority typed with spaces around it, beside a skill typed the same way
    # When a task is created with them, and created again with the priority as stored
    skills, priority = require_creation(
        tenant="t",
        task_id="t1",
        description="d",
        required_skills=[" Go "],
        priority=spelled,
        deadline=None,
    )
    # Then both are trimmed, and the repeat with the trimmed or the spaced spelling is the same task
    assert (skills, priority) == (["go"], "high")
    CREATED.ensure_same(**{**SAME, "priority": spelled})


@pytest.mark.parametrize("spelled", ["", "   ", "hi gh", "high\x00"])
def test_a_priority_that_is_blank_or_spaced_inside_is_still_refused(spelled: str) -> None:
    with pytest.raises(ValidationError) as refused:
        require_creation(
            tenant="t", task_id="t1", description="d", required_skills=[], priority=spelled, deadline=None
        )
    assert refused.value.field == "priority"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tenant": ""}, "tenant"),
        ({"task_id": "a/b"}, "task_id"),
        ({"description": ""}, "description"),
        ({"deadline": "tomorrow"}, "deadline"),
        ({"required_skills": "python"}, "required_skills"),
        ({"priority": "urgent"}, "priority"),
    ],
)
def test_a_new_task_with_a_bad_field_is_refused_naming_it(change: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {
        "tenant": "t",
        "task_id": "t1",
        "description": "d",
        "required_skills": [],
        "priority": "low",
        "deadline": None,
    }
    with pytest.raises(ValidationError) as refused:
        require_creation(**{**fields, **change})
    assert refused.value.field == field


@pytest.mark.parametrize(
    "deadline",
    [None, T0 + timedelta(hours=4), timedelta(hours=4), timedelta(hours=4, milliseconds=900)],
    ids=["left out", "the same moment", "the same delay", "the same delay a little later"],
)
def test_a_repeated_creation_of_the_same_task_passes(deadline: datetime | timedelta | None) -> None:
    CREATED.ensure_same(**SAME, deadline=deadline)


@pytest.mark.parametrize(
    "change",
    [
        {"description": "fix that"},
        {"required_skills": ["python"]},
        {"priority": "low"},
        {"deadline": T0 + timedelta(hours=5)},
        {"deadline": timedelta(hours=4, seconds=2)},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_repeated_creation_of_another_task_conflicts_and_says_what_the_task_has(
    change: dict[str, Any],
) -> None:
    with pytest.raises(TaskConflict) as conflict:
        CREATED.ensure_same(**{**SAME, **change})
    assert "priority='high' skills=['go', 'python'] deadline=2026-01-01T16:00:00+00:00" in str(conflict.value)


def test_a_repeat_naming_a_deadline_conflicts_with_a_task_that_has_none() -> None:
    created = CreationTerms(
        task_id="t1", description="fix it", skills=(), priority="low", deadline=None, created_on=T0
    )
    with pytest.raises(TaskConflict, match="deadline=none"):
        created.ensure_same(
            description="fix it", required_skills=[], priority="low", deadline=timedelta(hours=1)
        )


def test_a_requeue_may_leave_out_a_deadline_still_ahead_but_not_one_passed() -> None:
    # Given a task whose deadline is an hour ahead
    ahead = T0 + timedelta(hours=1)
    # When it is requeued without a new one, Then that passes
    require_requeue_deadline(None, ahead, T0)
    require_requeue_deadline(None, None, T0)
    # and once the deadline has passed, a new one is needed
    with pytest.raises(ValidationError, match="is needed: the task's deadline") as refused:
        require_requeue_deadline(None, ahead, ahead)
    # naming what each kind of caller gives (REST and the CLI name the deadline apart)
    assert "deadline_hours over HTTP" in str(refused.value)
    assert "--deadline-hours on the command line" in str(refused.value)


@pytest.mark.parametrize("deadline", [T0, T0 - timedelta(seconds=1)])
def test_a_requeue_deadline_must_be_after_now(deadline: datetime) -> None:
    with pytest.raises(ValidationError, match="must be after now"):
        require_requeue_deadline(deadline, None, T0)


def test_only_a_waiting_task_without_skills_whose_classifications_all_failed_is_held_back() -> None:
    held: dict[str, Any] = {"waiting": True, "creator_skills": (), "classified": False, "failures": 2}
    assert held_back_reason(**held) == (
        "its classification failed (2 attempts, none succeeded) and it names no skills,"
        " so what it needs is not known: reclassify it (or record a classification) first"
    )
    assert "(1 attempt," in str(held_back_reason(**{**held, "failures": 1}))
    for change in ({"waiting": False}, {"creator_skills": ("go",)}, {"classified": True}, {"failures": 0}):
        assert held_back_reason(**{**held, **change}) is None
