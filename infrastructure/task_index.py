"""Finding tasks and agents without a projection: tail the notification log for their creations.

Task ids and agent ids are the caller's strings, so a command never needs a lookup. The
sweeps (``escalate_overdue``, ``assign_pending``) and the agent roster do need to enumerate
them; rather than keep a hot index aggregate that every creation would contend on, each
engine tails the application's notification log for ``Task.Created`` and
``Agent.Registered`` only (``select_notifications(..., topics=...)``), remembering its
position. This is sound because the PostgreSQL recorder takes a table lock per insert, so
notification ids become visible in increasing order: nothing can appear behind the cursor.
Everything a Created event fixes (id, priority, deadline) is cached; whether a task is
still open is read from the task itself. A task seen completed or escalated is dropped
from the open set for good, since those statuses are final.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.utils import get_topic

from flowledger.domain.agent import Agent
from flowledger.domain.task import Task
from flowledger.domain.task_views import TaskPriority

_PAGE = 500


@dataclass(frozen=True, kw_only=True)
class IndexedTask:
    """What a Task.Created event fixed for good."""

    task_id: str
    aggregate_id: UUID
    priority: TaskPriority
    deadline: datetime | None
    position: int


class CreationIndex:
    """Tasks and agents of one tenant, as found in the notification log."""

    def __init__(self, app: Application[Any], tenant: str) -> None:
        self._app = app
        self._tenant = tenant
        self._lock = threading.Lock()
        self._position = 0
        self._open: dict[UUID, IndexedTask] = {}
        self._agents: dict[UUID, str] = {}
        self._topics = [get_topic(Task.Created), get_topic(Agent.Registered)]

    def refresh(self) -> None:
        """Read creations appended since the last refresh."""
        with self._lock:
            while True:
                page = self._app.recorder.select_notifications(
                    self._position + 1, _PAGE, topics=self._topics
                )
                for notification in page:
                    self._position = max(self._position, notification.id)
                    self._add(self._app.mapper.to_domain_event(notification), notification.id)
                if len(page) < _PAGE:
                    return

    def _add(self, created: Any, position: int) -> None:
        if created.tenant != self._tenant:
            return
        if isinstance(created, Task.Created):
            self._open[created.originator_id] = IndexedTask(
                task_id=created.task_id,
                aggregate_id=created.originator_id,
                priority=TaskPriority(created.priority),
                deadline=created.deadline,
                position=position,
            )
        elif isinstance(created, Agent.Registered):
            self._agents[created.originator_id] = created.agent_id

    def open_tasks(self) -> list[IndexedTask]:
        """Tasks not yet seen completed or escalated, oldest first."""
        self.refresh()
        with self._lock:
            return sorted(self._open.values(), key=lambda task: task.position)

    def overdue_tasks(self, now: datetime) -> list[IndexedTask]:
        """Open tasks whose deadline is at or before ``now``, earliest deadline first."""
        due = [t for t in self.open_tasks() if t.deadline is not None and t.deadline <= now]
        return sorted(due, key=lambda task: (task.deadline, task.position))

    def closed(self, aggregate_id: UUID) -> None:
        """Forget a task seen in a final status (completed or escalated)."""
        with self._lock:
            self._open.pop(aggregate_id, None)

    def agent_ids(self) -> list[str]:
        """Every registered agent's id, in registration order."""
        self.refresh()
        with self._lock:
            return list(self._agents.values())
