"""Two engines on one schema stand in for two servers: a command refused on the state of a
writer's cached copy is decided again on the log's state before the refusal reaches the caller
(found by ``tests/e2e/test_multi_process.py``: a task assigned by one server was completed
through another, which answered 409 "it is pending" from its cache)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowledger.domain.errors import SessionExpired, TaskTransitionRejected
from flowledger.domain.session_views import SessionStatus
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.clock import SetClock


@pytest.fixture
def two_servers(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    one, other = (Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) for _ in "ab")
    yield one, other
    one.close()
    other.close()


def test_a_task_assigned_elsewhere_is_completed_here_despite_a_cached_pending_copy(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a pending task that the other engine holds in its writers' cache
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    one.create_task("T-1", "fix the worker", ["python"])
    other.create_task("T-1", "fix the worker", ["python"])  # the same task again: cached there
    # When one engine assigns it and the other completes it
    assert one.assign_task("T-1").status is TaskStatus.ASSIGNED
    done = other.complete_task("T-1", {"fixed": True})
    # Then it is completed and the agent freed, as if the other engine had never cached it
    assert done.status is TaskStatus.COMPLETED
    assert one.get_agent("a-1").load == 0


def test_a_refusal_that_the_log_confirms_still_reaches_the_caller(two_servers: tuple[Engine, Engine]) -> None:
    one, other = two_servers
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    other.create_task("T-2", "fix the worker", ["python"])
    one.assign_task("T-2")
    one.complete_task("T-2", {"fixed": True})
    # The other engine's copy says assigned-to-nobody; the log says completed: still refused
    with pytest.raises(TaskTransitionRejected):
        other.start_task("T-2")


def test_a_task_and_agent_both_cached_stale_are_both_read_afresh(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given an agent in the other engine's cache (it completed the agent's first task there),
    # and a new task cached there as pending
    one.register_agent("a-1", "Agent 1", ["python"], capacity=2)
    one.create_task("T-1", "fix the worker", ["python"])
    one.assign_task("T-1")
    other.complete_task("T-1", {"fixed": True})
    one.create_task("T-2", "fix the queue", ["python"])
    other.create_task("T-2", "fix the queue", ["python"])
    # When one engine gives the agent the new task and the other completes it
    assert one.assign_task("T-2").status is TaskStatus.ASSIGNED
    done = other.complete_task("T-2", {"fixed": True})
    # Then the other engine read both afresh rather than refuse "pending" or "does not hold"
    assert done.status is TaskStatus.COMPLETED
    assert one.get_agent("a-1").load == 0


def test_a_complete_that_loses_a_race_to_another_server_is_told_the_task_is_completed(
    two_servers: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, other = two_servers
    # Given an assigned task that the other engine has never cached
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    one.create_task("T-1", "fix the worker", ["python"])
    one.assign_task("T-1")
    # And one engine completes it after the other read the task (assigned) from the log but
    # before it read the agent (an outside probe: 1 in 60 racing completes over REST)
    reads = other.task_reads
    read_agent = reads.agent

    def agent_after_the_race(uow: Any, agent_id: str) -> Any:
        if not raced:
            raced.append(one.complete_task("T-1", {"by": "one"}))
        return read_agent(uow, agent_id)

    raced: list[object] = []
    monkeypatch.setattr(reads, "agent", agent_after_the_race)
    # When the other engine completes it too
    with pytest.raises(TaskTransitionRejected) as refused:
        other.complete_task("T-1", {"by": "other"})
    # Then it is told the task is completed (not "agent a-1 does not hold task T-1"), and the
    # first completion stands with the agent freed once
    assert refused.value.status == "completed"
    assert one.get_task("T-1").result == {"by": "one"}
    assert one.get_agent("a-1").load == 0


def test_a_sweep_that_loses_the_race_on_its_fresh_read_too_tries_again_rather_than_refuse(
    two_servers: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A library probe, 2 processes x 4 engines of random router commands for 25 s: one
    # escalate_overdue raised TaskNotHeld. A refusal decided on several aggregates is decided
    # once more on the log's state, but that second read raced again: the task moved from one
    # agent to another both times between reading the task and reading its agent.)
    one, other = two_servers
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    one.register_agent("a-2", "Agent 2", ["python"], capacity=1)
    one.set_agent_capacity("a-2", 0)
    one.create_task("T-1", "fix the worker", ["python"], deadline=timedelta(minutes=1))
    assert one.assign_task("T-1").agent_id == "a-1"
    reads = other.task_reads
    read_agent = reads.agent
    moves = [("a-1", "a-2"), ("a-2", "a-1")]  # the task changes hands before each agent read

    def agent_after_the_race(uow: Any, agent_id: str) -> Any:
        if moves:
            held, taker = moves.pop(0)
            one.release_task("T-1", "handed over")
            one.set_agent_capacity(held, 0)
            one.set_agent_capacity(taker, 1)
            assert one.assign_task("T-1").agent_id == taker
        return read_agent(uow, agent_id)

    monkeypatch.setattr(reads, "agent", agent_after_the_race)
    # When the other engine sweeps once the deadline has passed
    [escalated] = other.escalate_overdue(datetime.now(UTC) + timedelta(hours=1))
    # Then the task is escalated from the agent that held it last, which is freed
    assert not moves
    assert escalated.status is TaskStatus.ESCALATED
    escalations = [e for e in one.task_history("T-1") if e.event_type.endswith("Escalated")]
    assert [e.data["agent_id"] for e in escalations] == ["a-1"]
    assert one.get_agent("a-1").load == one.get_agent("a-2").load == 0


# A command that finds nothing to do on a cached copy saves nothing, so no version check
# catches a copy another server has changed since: it answered 2xx and did nothing (an outside
# probe, 10 of 10 each). Such an answer is now decided once more on the log's state.


def test_an_assign_on_a_stale_escalated_copy_assigns_the_requeued_task(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a task the other engine escalated (no agent could take it), cached there
    other.create_task("T-1", "fix the worker", ["python"])
    assert other.assign_task("T-1").status is TaskStatus.ESCALATED
    # When a person requeues it through one engine, and an agent appears
    one.requeue_task("T-1", "ops@example.com", "an agent joined")
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    # Then an assign through the other engine assigns it, rather than answer "escalated"
    assert other.assign_task("T-1").status is TaskStatus.ASSIGNED
    assert one.get_task("T-1").status is TaskStatus.ASSIGNED
    assert one.get_agent("a-1").load == 1


def test_a_capacity_set_on_a_stale_copy_is_set(two_servers: tuple[Engine, Engine]) -> None:
    one, other = two_servers
    other.register_agent("a-1", "Agent 1", ["python"], capacity=5)  # cached there at 5
    one.set_agent_capacity("a-1", 3)
    # Setting 5 through the other engine is a change (the log says 3), not "already 5"
    assert other.set_agent_capacity("a-1", 5).capacity == 5
    assert one.get_agent("a-1").capacity == 5


def test_a_sweep_on_a_stale_copy_escalates_a_requeued_overdue_task(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given an overdue task the other engine's sweep escalated (cached there as escalated)
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    other.create_task("T-1", "fix the worker", ["python"], deadline=timedelta(minutes=1))
    later = datetime.now(UTC) + timedelta(hours=1)
    [escalated] = other.escalate_overdue(later)
    assert escalated.status is TaskStatus.ESCALATED
    # When a person requeues it through one engine without a new deadline (still overdue)
    one.requeue_task("T-1", "ops@example.com", "try again")
    assert one.get_task("T-1").status is TaskStatus.PENDING
    # Then the other engine's sweep escalates it again, as the log's state says it must
    assert [t.task_id for t in other.escalate_overdue(later)] == ["T-1"]
    assert one.get_task("T-1").status is TaskStatus.ESCALATED


def test_a_repeated_create_on_a_stale_copy_answers_the_tasks_state_now(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    other.create_task("T-1", "fix the worker", ["python"])  # cached there as pending
    one.assign_task("T-1")
    assert other.create_task("T-1", "fix the worker", ["python"]).status is TaskStatus.ASSIGNED


@pytest.fixture
def clocked_servers(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine, SetClock]]:
    """Two engines on one clock, and a one-hour session "s" cached by the first (it wrote a step)."""
    clock = SetClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings, clock=clock) as one, Engine(settings=settings, clock=clock) as other:
        one.start_session("s", "wf", ttl=timedelta(hours=1))
        one.record_step("s", "a")
        yield one, other, clock


def kinds(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


def test_a_session_extended_elsewhere_is_not_expired_here_by_a_stale_copy(
    clocked_servers: tuple[Engine, Engine, SetClock],
) -> None:
    one, other, clock = clocked_servers
    # When the other engine extends the session by five hours, and two hours pass
    other.extend_session("s", timedelta(hours=5))
    clock.now += timedelta(hours=2)
    # Then the first engine records the step: the log says the session lives (its cached
    # copy said expired; saving Expired clashed with the extension, and SessionExpired
    # reached the caller)
    assert one.record_step("s", "b").step == "b"
    assert one.get_session("s").status is SessionStatus.ACTIVE
    assert kinds(one, "s")[-1] == "StepProcessed"
    assert "Expired" not in kinds(one, "s")


def test_a_session_that_expired_is_still_expired_for_an_engine_with_a_stale_copy(
    clocked_servers: tuple[Engine, Engine, SetClock],
) -> None:
    one, other, clock = clocked_servers
    other.record_step("s", "b")  # the first engine's copy is one step behind
    clock.now += timedelta(hours=2)
    with pytest.raises(SessionExpired):
        one.record_step("s", "c")
    assert kinds(other, "s").count("Expired") == 1


def test_a_queue_run_offers_a_task_released_elsewhere_in_its_turn_despite_a_cached_assigned_copy(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given an agent holding two tasks, the oldest two of three, both assigned by queue runs of
    # one engine (so its writers' cache holds them as assigned), its capacity raised by the other
    one.register_agent("a-1", "Agent 1", ["python"], capacity=1)
    for task_id in ("T-1", "T-2", "T-3"):
        one.create_task(task_id, "fix the worker", ["python"])
    one.assign_pending()
    other.set_agent_capacity("a-1", 2)
    one.assign_pending()
    assert one.get_agent("a-1").active_tasks == ("T-1", "T-2")
    # When the other engine releases the oldest, and the first runs the queue
    other.release_task("T-1", "blocked")
    ran = {state.task_id: state for state in one.assign_pending()}
    # Then the released task, the oldest, is offered first and assigned again; nothing the run
    # answers is the cached copy's (it said T-1 was assigned while it waited, and gave T-3
    # the agent)
    assert ran["T-1"].agent_id == "a-1"
    assert ran["T-3"].status is TaskStatus.PENDING
    assert one.get_agent("a-1").active_tasks == ("T-2", "T-1")
