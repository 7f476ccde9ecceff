"""Which commands a task may take in each status, in one table, and the refusal when it may not."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from flowledger.domain.errors import TaskTransitionRejected
from flowledger.domain.task_views import Assignment, TaskStatus

TaskAction = Literal[
    "classify", "reclassify", "assign", "start", "complete", "release", "escalate", "requeue"
]
"""A command that moves a task (or, classifying, may change how it is routed)."""

_OPEN = frozenset({TaskStatus.PENDING, TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS})
_HELD = frozenset(status for status in TaskStatus if status.holds_agent)

ALLOWED_FROM: Mapping[TaskAction, frozenset[TaskStatus]] = MappingProxyType(
    {
        "classify": _OPEN,
        "reclassify": _OPEN,
        "assign": frozenset({TaskStatus.PENDING}),
        "start": frozenset({TaskStatus.ASSIGNED}),
        "complete": _HELD,
        "release": _HELD,
        "escalate": _OPEN,
        "requeue": frozenset({TaskStatus.ESCALATED}),
    }
)
"""The statuses each command is taken in: a closed task takes none but a person's requeue."""


def whereabouts(status: TaskStatus, assignment: Assignment | None, times_assigned: int) -> str:
    """Where a task in ``status`` stands, for a refusal: its assignment and holder, or that no
    agent holds it ("cannot complete task 'T-3': it is pending" left a caller who named
    assignment 1 to guess whether it was released, requeued or never assigned)."""
    if status.holds_agent and assignment is not None:
        return f"{status.value}, on assignment {times_assigned}, held by agent {assignment.agent_id!r}"
    if status is TaskStatus.COMPLETED and assignment is not None:
        return f"completed by agent {assignment.agent_id!r} on assignment {times_assigned}"
    if status is TaskStatus.PENDING and times_assigned == 0:
        return "pending, never assigned (no agent holds it)"
    if status is TaskStatus.PENDING:
        return f"pending, back in the queue after assignment {times_assigned} (no agent holds it)"
    return f"{status.value} (no agent holds it)"


def require_transition(
    task_id: str,
    status: TaskStatus,
    action: TaskAction,
    *,
    where: str | None = None,
    named: str | None = None,
) -> None:
    """Raise TaskTransitionRejected unless a task in ``status`` may take ``action``; ``where``
    (``whereabouts``) and ``named`` (the assignment the command was sent for) go in its message."""
    if status not in ALLOWED_FROM[action]:
        raise TaskTransitionRejected(task_id, status.value, action, where=where, named=named)
