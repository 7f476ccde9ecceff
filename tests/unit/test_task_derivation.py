"""What a classification's derivation changes about a task's routing (the engine-level tests:
test_task_classification.py, test_task_router.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from flowledger.domain.skills import Derivation
from flowledger.domain.task_derivation import RoutingChange, routing_change
from flowledger.domain.task_views import TaskPriority
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

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


def test_a_task_no_longer_waiting_keeps_its_routing_and_the_event_says_why() -> None:
    # An outside probe: a reclassification of an assigned task recorded derivation '' and
    # nothing else, so its history could not tell why the critical complexity raised nothing.
    change = routing_change(
        RAISING, waiting=False, priority="low", creator_priority="low", complexity="critical"
    )
    assert change == RoutingChange(
        derivation="not applied, an agent holds the task (a classification routes a task only while it"
        " waits): skills go from the words 'go'; priority raised from low to critical by critical complexity"
    )


def test_a_task_no_longer_waiting_with_nothing_to_derive_records_no_reason() -> None:
    change = routing_change(
        Derivation(), waiting=False, priority="low", creator_priority="low", complexity="low"
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


def test_a_classification_recorded_after_the_assignment_says_it_was_not_applied() -> None:
    # Given a task created without skills and assigned before it was classified
    engine = Engine(settings=make_settings(database_url="memory:"))
    try:
        engine.register_agent("be", "Backend", ["python", "golang"])
        engine.create_task("T-1", "Fix the race in the Go worker", [], "low")
        assert engine.assign_task("T-1").agent_id == "be"
        # When its classification is recorded
        task = engine.record_classification("T-1", "bug_fix", "critical", 12.0)
        # Then it routes nothing, and its event says what it would have derived and why not
        assert (task.required_skills, task.priority.value, task.deadline) == ((), "low", None)
        data = engine.task_history("T-1")[-1].data
        assert data["required_skills"] is None
        assert data["derivation"].startswith("not applied, an agent holds the task")
        assert "skills golang from the words 'Go'" in data["derivation"]
    finally:
        engine.close()
