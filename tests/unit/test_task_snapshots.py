"""Task snapshots across versions: one taken before a released or requeued task dropped its
assignment (class version 1) loads without it; a version-2 snapshot loads as it was taken."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.domain import Snapshot
from eventsourcing.persistence import DatetimeAsISO, DecimalAsStr, JSONTranscoder, Mapper, UUIDAsHex

from flowledger.domain.assignment import Choice
from flowledger.domain.task import Task
from flowledger.domain.task_views import Assignment, EscalationReason
from flowledger.infrastructure.transcodings import register_transcodings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def json_mapper() -> Mapper[Any]:
    """A mapper that encodes like the engine's: the library's transcodings plus flowledger's."""
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    register_transcodings(transcoder)
    return Mapper(transcoder=transcoder)


def assigned_task(task_id: str) -> Task:
    task = Task.create(
        task_id=task_id,
        tenant="acme",
        description="Fix it",
        required_skills=["go"],
        priority="high",
        deadline=None,
    )
    task.assign(Choice(agent_id="be", score=0.9, reason="covers go"), T0)
    return task


def loaded(snapshot: Snapshot) -> Task:
    mapper = json_mapper()
    stored = mapper.to_domain_event(mapper.to_stored_event(snapshot))
    assert isinstance(stored, Snapshot)
    task = stored.mutate(None)
    assert isinstance(task, Task)
    return task


def as_version_1(task: Task, assignment: Assignment) -> Snapshot:
    """The snapshot a task's version 1 took: the assignment kept, no class version."""
    task.collect_events()
    snapshot = Snapshot.take(task)
    state = {key: value for key, value in snapshot.state.items() if key != "class_version"}
    return Snapshot(
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state={**state, "assignment": assignment},
    )


def test_a_version_1_snapshot_of_a_released_or_requeued_task_loads_with_no_assignment() -> None:
    released = assigned_task("t1")
    held = released.assignment
    assert held is not None
    released.release("agent went home", T0 + timedelta(minutes=5))
    requeued = assigned_task("t2")
    requeued.escalate(EscalationReason.DEADLINE_BREACHED, "late", T0 + timedelta(hours=1))
    requeued.requeue("alice", "back", T0 + timedelta(hours=2))
    for task in (released, requeued):
        old = loaded(as_version_1(task, held))
        assert old.assignment is None
        assert vars(old) == vars(task)


def test_a_version_1_snapshot_of_a_held_or_escalated_task_keeps_its_assignment() -> None:
    held = assigned_task("t1")
    escalated = assigned_task("t2")
    escalated.escalate(EscalationReason.DEADLINE_BREACHED, "late", T0 + timedelta(hours=1))
    for task in (held, escalated):
        assert task.assignment is not None
        old = loaded(as_version_1(task, task.assignment))
        assert old.assignment == task.assignment
        assert vars(old) == vars(task)


def test_a_snapshot_of_today_loads_as_it_was_taken() -> None:
    task = assigned_task("t1")
    task.release("agent went home", T0 + timedelta(minutes=5))
    task.collect_events()
    assert vars(loaded(Snapshot.take(task))) == vars(task)
