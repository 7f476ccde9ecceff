"""Which command a task takes in which status: every status against every command, through the
aggregate, spelled out here rather than read from the rule's own table."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain.assignment import Choice
from flowledger.domain.errors import TaskTransitionRejected
from flowledger.domain.task import Task
from flowledger.domain.task_transitions import ALLOWED_FROM
from flowledger.domain.task_views import Classification, EscalationReason, TaskStatus

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=1)
CHOICE = Choice(agent_id="a1", score=1.0, reason="only one")
CLASSIFICATION = Classification(category="bug_fix", complexity="low", estimated_hours=1.0)


def a_task_in(status: TaskStatus) -> Task:
    task = Task.create(
        task_id="t1",
        tenant="t",
        description="fix it",
        required_skills=["python"],
        priority="high",
        deadline=None,
    )
    if status is TaskStatus.ESCALATED:
        task.escalate(EscalationReason.NO_CAPABLE_AGENT, "nobody", T0)
    if status in (TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS, TaskStatus.COMPLETED):
        task.assign(CHOICE, T0)
    if status in (TaskStatus.IN_PROGRESS, TaskStatus.COMPLETED):
        task.start(T0)
    if status is TaskStatus.COMPLETED:
        task.complete({"ok": True}, T0)
    assert task.task_status is status
    return task


COMMANDS: dict[str, Callable[[Task], object]] = {
    "classify": lambda task: task.classify(CLASSIFICATION),
    "reclassify": lambda task: task.classify(CLASSIFICATION, again=True),
    "assign": lambda task: task.assign(CHOICE, LATER),
    "start": lambda task: task.start(LATER),
    "complete": lambda task: task.complete({"ok": True}, LATER),
    "release": lambda task: task.release("busy elsewhere", LATER),
    "escalate": lambda task: task.escalate(EscalationReason.DEADLINE_BREACHED, "late", LATER),
    "requeue": lambda task: task.requeue("ops", "try again", LATER),
}
OPEN = {TaskStatus.PENDING, TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS}
HELD = {TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS}
ALLOWED = {
    "classify": OPEN,
    "reclassify": OPEN,
    "assign": {TaskStatus.PENDING},
    "start": {TaskStatus.ASSIGNED},
    "complete": HELD,
    "release": HELD,
    "escalate": OPEN,
    "requeue": {TaskStatus.ESCALATED},
}
CASES = [(action, status) for action in COMMANDS for status in TaskStatus]


@pytest.mark.parametrize(("action", "status"), CASES, ids=[f"{a}-{s.value}" for a, s in CASES])
def test_a_command_is_taken_only_in_the_statuses_that_allow_it(action: str, status: TaskStatus) -> None:
    # Given a task in the status
    task = a_task_in(status)
    before = task.version
    if status in ALLOWED[action]:
        # When the command runs where it is allowed, Then it records an event
        COMMANDS[action](task)
        assert task.version == before + 1
        return
    # When it runs anywhere else, Then it is refused (naming status and action) and nothing is recorded
    with pytest.raises(TaskTransitionRejected) as refused:
        COMMANDS[action](task)
    assert (refused.value.status, refused.value.action) == (status.value, action)
    assert task.version == before


def test_the_rule_table_names_every_command_and_no_other() -> None:
    assert {action: set(statuses) for action, statuses in ALLOWED_FROM.items()} == ALLOWED
