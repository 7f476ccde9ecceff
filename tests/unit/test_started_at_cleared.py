"""A task back in the queue shows no start: released or requeued, its ``started_at`` is None.

An outside probe: ``SR1`` assigned, started, then released (``POST .../release``): the task
answered ``status: pending, agent_id: null, assignment: null`` beside the old ``started_at``,
a waiting task that claimed to have been started; assigned again, the field went back to
null. The same held after an escalated in-progress task was requeued, and in the current-state
read model. A start belongs to the assignment it was made under: the task's state, its
replay, the read model's row and a snapshot taken before this rule now agree on that.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from eventsourcing.domain import Snapshot

from flowledger.domain.assignment import Choice
from flowledger.domain.task import Task
from flowledger.domain.task_views import EscalationReason, TaskStatus
from flowledger.projections.work_rows import created_task_row, fold_task

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
CHOICE = Choice(agent_id="ops", score=1.0, reason="covers docker")


def started_task() -> Task:
    task = Task.create(
        task_id="SR1",
        tenant="acme",
        description="x",
        required_skills=["docker"],
        priority="medium",
        deadline=None,
    )
    task.assign(CHOICE, T0)
    task.start(T0 + timedelta(minutes=1))
    assert task.state().started_at == T0 + timedelta(minutes=1)
    return task


def released() -> Task:
    task = started_task()
    task.release("handover", T0 + timedelta(minutes=2))
    return task


def requeued() -> Task:
    task = started_task()
    task.escalate(EscalationReason.DEADLINE_BREACHED, "late", T0 + timedelta(minutes=2))
    assert task.state().started_at is not None  # an escalated task keeps what it was taken from
    task.requeue("alice", "back", T0 + timedelta(minutes=3), deadline=T0 + timedelta(hours=4))
    return task


def row_of(task: Task) -> dict[str, object]:
    events = task.collect_events()
    first, *later = events
    assert isinstance(first, Task.Created)
    row = created_task_row(first)
    for event in later:
        fold_task(row, event)
    return row


def test_a_released_or_requeued_task_shows_no_start() -> None:
    for back in (released(), requeued()):
        state = back.state()
        assert (state.status, state.assignment, state.started_at) == (TaskStatus.PENDING, None, None)


def test_the_read_model_row_of_a_task_back_in_the_queue_shows_no_start() -> None:
    for back in (released(), requeued()):
        row = row_of(back)
        assert (row["status"], row["started_at"]) == ("pending", None)


def test_a_snapshot_taken_with_the_old_start_reads_without_it() -> None:
    # Given a released task as the fold before this rule left it: pending, the start kept
    task = released()
    task.collect_events()
    snapshot = Snapshot.take(task)
    old = Snapshot(
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state={**snapshot.state, "started_at": T0 + timedelta(minutes=1)},
    )
    loaded = old.mutate(None)
    assert isinstance(loaded, Task)
    # Then its state shows no start, as a replay of its events does
    assert loaded.state().started_at is None


def test_a_completed_task_keeps_its_start() -> None:
    task = started_task()
    task.complete({"ok": True}, T0 + timedelta(minutes=5))
    assert task.state().started_at == T0 + timedelta(minutes=1)
    assert row_of(task)["started_at"] == T0 + timedelta(minutes=1)
