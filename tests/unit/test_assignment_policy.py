"""The assignment policy: eligibility, ranking, escalation reasons and queue order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flowledger.domain.assignment import (
    AgentProfile,
    Choice,
    NoChoice,
    QueuedTask,
    choose_agent,
    coverage,
    in_queue_order,
    rank_candidates,
)
from flowledger.domain.task_views import EscalationReason, TaskPriority

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def agent(
    agent_id: str, skills: str, capacity: int = 10, load: int = 0, recent: float | None = None
) -> AgentProfile:
    return AgentProfile(
        agent_id=agent_id,
        skills=frozenset(skills.split()),
        capacity=capacity,
        load=load,
        recent_completion_seconds=recent,
    )


def test_coverage_is_the_share_of_required_skills_an_agent_has() -> None:
    assert coverage({"python", "sql"}, {"python"}) == 0.5
    assert coverage({"python"}, {"python", "go"}) == 1.0
    assert coverage(set(), {"go"}) == 1.0


def test_an_agent_missing_a_required_skill_is_never_chosen() -> None:
    # Given a partially skilled agent with no load and a fully skilled busy one
    agents = [agent("partial", "python", load=0), agent("full", "python sql", load=9)]

    # When a task needs python and sql
    decision = choose_agent("t1", {"python", "sql"}, agents)

    # Then the fully skilled one gets it
    assert isinstance(decision, Choice)
    assert decision.agent_id == "full"


def test_prefers_the_least_relatively_loaded_agent_not_the_least_loaded() -> None:
    agents = [agent("small", "python", capacity=2, load=1), agent("big", "python", capacity=10, load=3)]
    decision = choose_agent("t1", {"python"}, agents)
    assert isinstance(decision, Choice)
    assert decision.agent_id == "big"
    assert decision.score == 0.7
    assert "3/10" in decision.reason


def test_equal_loads_go_to_the_agent_with_the_faster_recent_completions() -> None:
    agents = [
        agent("slow", "go", load=1, recent=7200.0),
        agent("fast", "go", load=1, recent=600.0),
        agent("new", "go", load=1),
    ]
    ranked = rank_candidates("t1", {"go"}, agents)
    assert [a.agent_id for a in ranked] == ["fast", "slow", "new"]


def test_escalates_as_no_capable_agent_when_nobody_covers_the_skills() -> None:
    decision = choose_agent("t1", {"cobol"}, [agent("a", "python"), agent("b", "react")])
    assert isinstance(decision, NoChoice)
    assert decision.reason is EscalationReason.NO_CAPABLE_AGENT
    assert "cobol" in decision.detail


def test_escalates_as_all_at_capacity_when_every_capable_agent_is_full() -> None:
    agents = [
        agent("a", "python", capacity=2, load=2),
        agent("b", "python", capacity=0),
        agent("idle", "react", load=0),
    ]
    decision = choose_agent("t1", {"python"}, agents)
    assert isinstance(decision, NoChoice)
    assert decision.reason is EscalationReason.ALL_AT_CAPACITY


def test_with_no_agents_at_all_nobody_is_capable() -> None:
    decision = choose_agent("t1", set(), [])
    assert isinstance(decision, NoChoice)
    assert decision.reason is EscalationReason.NO_CAPABLE_AGENT


def test_exact_ties_are_spread_over_agents_but_stable_per_task() -> None:
    agents = [agent(f"a{n}", "python") for n in range(5)]
    chosen = {choose_agent(f"t{n}", {"python"}, agents) for n in range(40)}
    picked = {c.agent_id for c in chosen if isinstance(c, Choice)}
    assert len(picked) > 1
    assert choose_agent("t7", {"python"}, agents) == choose_agent("t7", {"python"}, agents)


def test_a_critical_task_is_served_before_an_older_low_one() -> None:
    low = QueuedTask(task_id="low", priority=TaskPriority.LOW, deadline=None, created_at=T0)
    critical = QueuedTask(
        task_id="crit", priority=TaskPriority.CRITICAL, deadline=None, created_at=T0 + timedelta(hours=1)
    )
    assert [t.task_id for t in in_queue_order([low, critical])] == ["crit", "low"]


def test_within_a_priority_the_earliest_deadline_then_the_oldest_goes_first() -> None:
    def queued(task_id: str, deadline: datetime | None, minute: int) -> QueuedTask:
        return QueuedTask(
            task_id=task_id,
            priority=TaskPriority.HIGH,
            deadline=deadline,
            created_at=T0 + timedelta(minutes=minute),
        )

    tasks = [
        queued("no-deadline", None, 0),
        queued("later", T0 + timedelta(days=2), 1),
        queued("sooner", T0 + timedelta(days=1), 2),
        queued("no-deadline-newer", None, 3),
    ]
    order = [t.task_id for t in in_queue_order(tasks)]
    assert order == ["sooner", "later", "no-deadline", "no-deadline-newer"]
