"""Task and agent queries, and finding them inside a unit of work (shared by the task use cases)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from uuid import UUID

from flowledger.domain.agent import Agent, agent_uuid
from flowledger.domain.bounds import shown, versions_held
from flowledger.domain.errors import AgentNotFound, TaskNotFound, ValidationError
from flowledger.domain.task import Task, task_uuid
from flowledger.domain.task_checks import require_limit
from flowledger.domain.task_views import AgentState, TaskPriority, TaskState, TaskStatus
from flowledger.domain.values import require_name, require_version
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_index import IndexedTask, LogIndex
from flowledger.infrastructure.history import HistoryEntry, history_entry

LOAD_BATCH = 100
"""Tasks a listing or a queue run reads at once (``TaskReads.loaded``)."""


def _overdue(state: TaskState, now: datetime) -> bool:
    return not state.status.is_final and state.deadline is not None and now >= state.deadline


def task_key(task_id: str) -> str:
    """The in-process lock key of a task (apart from session ids). An id that is no string is
    refused under the lock (``task_uuid``); its key only has to be made without raising."""
    return f"task\x1f{task_id if isinstance(task_id, str) else shown(task_id)}"


def agent_key(agent_id: str) -> str:
    """The in-process lock key of an agent (an id that is no string: as ``task_key``)."""
    return f"agent\x1f{agent_id if isinstance(agent_id, str) else shown(agent_id)}"


class TaskReads:
    """Reads of one tenant's tasks and agents: states, histories, the open queue."""

    def __init__(self, store: AggregateStore, tenant: str, index: LogIndex) -> None:
        self._store = store
        self._tenant = tenant
        self.index = index

    def task_uuid(self, task_id: str) -> UUID:
        """The aggregate id of a caller's task id in this tenant."""
        return task_uuid(self._tenant, task_id)

    def agent_uuid(self, agent_id: str) -> UUID:
        """The aggregate id of a caller's agent id in this tenant."""
        return agent_uuid(self._tenant, agent_id)

    def get_task(self, task_id: str, version: int | None = None) -> TaskState:
        """The task now, or at a version."""
        require_version("version", version, optional=True)
        task: Task | None = self._store.load(self.task_uuid(task_id), version)
        if task is None:
            raise TaskNotFound(task_id)
        if version is not None and task.version < version:
            raise ValidationError("version", f"task has {versions_held(task.version)}, not {shown(version)}")
        return task.state()

    def task_history(self, task_id: str) -> list[HistoryEntry]:
        """The task's events, oldest first."""
        events = self._store.events(self.task_uuid(task_id))
        if not events:
            raise TaskNotFound(task_id)
        return [history_entry(e) for e in events]

    def get_agent(self, agent_id: str, version: int | None = None) -> AgentState:
        """The agent now, or at a version."""
        require_version("version", version, optional=True)
        agent: Agent | None = self._store.load(self.agent_uuid(agent_id), version)
        if agent is None:
            raise AgentNotFound(agent_id)
        if version is not None and agent.version < version:
            raise ValidationError(
                "version", f"agent has {versions_held(agent.version)}, not {shown(version)}"
            )
        return agent.state()

    def agent_history(self, agent_id: str) -> list[HistoryEntry]:
        """The agent's events, oldest first."""
        events = self._store.events(self.agent_uuid(agent_id))
        if not events:
            raise AgentNotFound(agent_id)
        return [history_entry(e) for e in events]

    def list_agents(self) -> list[AgentState]:
        """Every registered agent, in registration order."""
        return [self.get_agent(agent_id) for agent_id in self.index.agent_ids()]

    def open_tasks(self) -> list[TaskState]:
        """Tasks not completed or escalated, oldest first."""
        states = []
        for entry in self.index.open_tasks():
            state = self.get_task(entry.task_id)
            self.note(state)
            if not state.status.is_final:
                states.append(state)
        return states

    def list_tasks(
        self,
        *,
        status: str | None = None,
        priority: str | None = None,
        agent_id: str | None = None,
        overdue: bool | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[TaskState]:
        """Tasks matching every filter given (``agent_id``: the agent holding the task, or
        the one that completed it; ``overdue``: open and past the deadline by the engine's
        clock, or, false, open and not past it), oldest first, at most ``limit``, created
        after the task ``after`` (the last id of the page before: a listing longer than
        ``limit`` is read page by page). Open-only filters read the open queue; ``overdue`` with
        a closed status (completed, escalated) is refused, as it could only ever list nothing,
        and so is ``agent_id`` with a status no agent holds a task in (pending, escalated)."""
        if after is not None:
            require_name("after", after)
        if agent_id is not None:
            require_name("agent_id", agent_id)
            if not self.index.has_agent(agent_id):
                # As a cursor naming no task is: a typo listed nothing, read as an idle agent.
                raise ValidationError("agent_id", f"no agent {shown(agent_id)} in this tenant")
        wanted_status = TaskStatus.parse(status) if status is not None else None
        wanted_priority = TaskPriority.parse(priority) if priority is not None else None
        if overdue is not None and not isinstance(overdue, bool):
            raise ValidationError("overdue", f"must be true, false or None, got {shown(overdue)}")
        if overdue is not None and wanted_status is not None and wanted_status.is_final:
            # A closed task is neither overdue nor not: the pair would list nothing, always.
            raise ValidationError(
                "overdue", f"looks at open tasks only; status={wanted_status.value} tasks are closed"
            )
        if agent_id is not None and wanted_status in (TaskStatus.PENDING, TaskStatus.ESCALATED):
            # No agent holds a waiting or escalated task (its agent_id is null): the pair would
            # list nothing, always, where a caller asking for an agent's queue meant something.
            raise ValidationError(
                "agent_id",
                f"names the agent holding a task, or the one that completed it; status="
                f"{wanted_status.value} tasks are held by no agent",
            )
        require_limit(limit)
        open_only = overdue is not None or (wanted_status is not None and not wanted_status.is_final)
        entries = self.index.open_tasks() if open_only else self.index.all_tasks()
        if after is not None:
            cursor = self.index.task_entry(self.task_uuid(after))
            if cursor is None:
                raise ValidationError("after", f"no task {shown(after)} in this tenant")
            entries = [entry for entry in entries if entry.position > cursor.position]
        now = self._store.clock()
        found = []
        for entry, task in self.loaded(entries):
            if task is None:
                raise TaskNotFound(entry.task_id)
            state = task.state()
            self.note(state)
            if open_only and state.status.is_final:
                continue  # closed since the index last looked
            if (
                (wanted_status is None or state.status is wanted_status)
                and (wanted_priority is None or state.priority is wanted_priority)
                and (agent_id is None or state.agent_id == agent_id)
                and (overdue is None or _overdue(state, now) is overdue)
            ):
                found.append(state)
                if len(found) == limit:
                    break
        return found

    def loaded(self, entries: Sequence[IndexedTask]) -> Iterator[tuple[IndexedTask, Task | None]]:
        """Each entry's task (None: not found), read a batch at a time as they are asked for
        (``AggregateStore.folded_many``; one that does not fold so is loaded alone when its turn
        comes): a listing that stops at its limit reads and fails no further."""
        for start in range(0, len(entries), LOAD_BATCH):
            batch = entries[start : start + LOAD_BATCH]
            tasks = self._store.folded_many([entry.aggregate_id for entry in batch])
            for entry in batch:
                task = tasks.get(entry.aggregate_id)
                yield entry, task if task is not None else self._store.load(entry.aggregate_id)

    # -- inside a unit of work -------------------------------------------------------

    def task(self, uow: UnitOfWork, task_id: str) -> Task:
        """The task, opened for the command; TaskNotFound when there is none."""
        task: Task | None = uow.find(self.task_uuid(task_id))
        if task is None:
            raise TaskNotFound(task_id)
        return task

    def agent(self, uow: UnitOfWork, agent_id: str) -> Agent:
        """The agent, opened for the command; AgentNotFound when there is none."""
        agent: Agent | None = uow.find(self.agent_uuid(agent_id))
        if agent is None:
            raise AgentNotFound(agent_id)
        return agent

    def note(self, state: TaskState) -> None:
        """Drop a task seen completed or escalated from the open queue (those are final)."""
        if state.status.is_final:
            self.index.closed(self.task_uuid(state.task_id), state.version)
