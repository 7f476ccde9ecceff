"""Which commands a task may take in each status, in one table, and the refusal when it may not."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from flowledger.domain.errors import TaskTransitionRejected
from flowledger.domain.task_views import TaskStatus

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


def require_transition(task_id: str, status: TaskStatus, action: TaskAction) -> None:
    """Raise TaskTransitionRejected unless a task in ``status`` may take ``action``."""
    if status not in ALLOWED_FROM[action]:
        raise TaskTransitionRejected(task_id, status.value, action)
