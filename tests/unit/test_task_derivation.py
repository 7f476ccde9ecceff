"""What a classification's derivation changes about a task's routing (the engine-level tests:
test_task_classification.py, test_task_router.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from flowledger.domain.skills import Derivation
from flowledger.domain.task_derivation import RoutingChange, routing_change
from flowledger.domain.task_views import TaskPriority

DEADLINE = datetime(2026, 1, 2, tzinfo=UTC)
RAISING = Derivation(
    required_skills=("go",),
    priority=TaskPriority.CRITICAL,
    deadline=DEADLINE,
    reasons=("skills go from the words 'go'", "priority raised from low to critical by critical complexity"),
)


def test_a_waiting_task_takes_what_the_classification_derived_with_its_reasons() -> None:
    change = routing_change(
        RAISING, waiting=True, priority="low", creator_priority="low", complexity="critical"
    )
    assert change == RoutingChange(
        required_skills=("go",),
        priority="critical",
        deadline=DEADLINE,
        derivation="skills go from the words 'go';"
        " priority raised from low to critical by critical complexity",
    )


def test_a_task_no_longer_waiting_keeps_its_routing() -> None:
    change = routing_change(
        RAISING, waiting=False, priority="low", creator_priority="low", complexity="critical"
    )
    assert change == RoutingChange()


def test_a_classification_without_a_derivation_changes_nothing() -> None:
    assert routing_change(None, waiting=True, priority="low", creator_priority="low", complexity="low") == (
        RoutingChange()
    )


def test_a_raise_made_by_an_earlier_classification_goes_back_to_the_creators_priority() -> None:
    # Given a task created low whose first classification raised it to critical
    # When a reclassification derives no raise
    change = routing_change(
        Derivation(reasons=("skills kept",)),
        waiting=True,
        priority="critical",
        creator_priority="low",
        complexity="low",
    )
    # Then the creator's priority applies again, and the reasons say why
    assert change.priority == "low"
    assert change.derivation == "skills kept; priority back to low as created (low complexity raises none)"


def test_no_raise_on_a_task_at_its_creators_priority_leaves_the_priority_alone() -> None:
    change = routing_change(
        Derivation(), waiting=True, priority="high", creator_priority="high", complexity="low"
    )
    assert change == RoutingChange()
