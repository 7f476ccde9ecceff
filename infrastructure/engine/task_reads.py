"""The Engine's task and agent queries, and the loading and saving the task commands share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import IntegrityError
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from flowledger.domain.agent import Agent, agent_uuid
from flowledger.domain.errors import (
    AgentNotFound,
    ConcurrentUpdate,
    TaskNotFound,
    ValidationError,
)
from flowledger.domain.task import Task, task_uuid
from flowledger.domain.task_views import (
    AgentState,
    EscalationReason,
    ReleaseOutcome,
    TaskState,
    TaskStatus,
)
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.task_index import LogIndex
from flowledger.infrastructure.history import HistoryEntry, history_entry
from flowledger.infrastructure.settings import Settings

T = TypeVar("T")
_INDEX_LOCK = threading.Lock()
ASSIGNMENT_RETRY_FACTOR = 8


def task_key(task_id: str) -> str:
    """The in-process lock key of a task (apart from session ids)."""
    return f"task\x1f{task_id}"


def agent_key(agent_id: str) -> str:
    """The in-process lock key of an agent."""
    return f"agent\x1f{agent_id}"


class TaskQueries:
    """Mixed into Engine, which provides ``app``, ``tenant``, ``clock``, ``_lock``, ``_retrying``."""

    app: Application[Any]
    settings: Settings
    tenant: str
    clock: Callable[[], datetime]

    def _retrying(self, session_id: str, attempt: Callable[[], T]) -> T:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    def _lock(self, session_id: str) -> threading.Lock:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    @property
    def log_index(self) -> LogIndex:
        """This engine's cursor over the task and agent creations in the log."""
        index = self.__dict__.get("_log_index")
        if index is None:
            with _INDEX_LOCK:
                index = self.__dict__.setdefault("_log_index", LogIndex(self.app, self.tenant))
        return cast(LogIndex, index)

    @property
    def assignment_lock(self) -> threading.Lock:
        """Serialises this engine's assignment decisions.

        They all contend on the same few agents: in one process, letting them race only
        turns into lost writes. Across processes the agents' versions settle the race.
        """
        lock = self.__dict__.get("_assignment_lock")
        if lock is None:
            with _INDEX_LOCK:
                lock = self.__dict__.setdefault("_assignment_lock", threading.Lock())
        return cast(threading.Lock, lock)

    # -- queries -----------------------------------------------------------------------

    def get_task(self, task_id: str, version: int | None = None) -> TaskState:
        """The task now, or at a version."""
        if version is not None and version < 1:
            raise ValidationError("version", f"must be >= 1, got {version}")
        task = self._load_task(task_id, version)
        if version is not None and task.version < version:
            raise ValidationError("version", f"task has {task.version} versions, not {version}")
        return task.state()

    def task_history(self, task_id: str) -> list[HistoryEntry]:
        """The task's events, oldest first."""
        events = list(self.app.events.get(task_uuid(self.tenant, task_id)))
        if not events:
            raise TaskNotFound(task_id)
        return [history_entry(e) for e in events]

    def get_agent(self, agent_id: str, version: int | None = None) -> AgentState:
        """The agent now, or at a version."""
        return self._load_agent(agent_id, version).state()

    def agent_history(self, agent_id: str) -> list[HistoryEntry]:
        """The agent's events, oldest first."""
        events = list(self.app.events.get(agent_uuid(self.tenant, agent_id)))
        if not events:
            raise AgentNotFound(agent_id)
        return [history_entry(e) for e in events]

    def list_agents(self) -> list[AgentState]:
        """Every registered agent, in registration order."""
        return [agent.state() for agent in self._load_agents().values()]

    def open_tasks(self) -> list[TaskState]:
        """Tasks not completed or escalated, oldest first."""
        states = []
        for entry in self.log_index.open_tasks():
            task = self._load_task(entry.task_id)
            self._note_final(task)
            if not task.task_status.is_final:
                states.append(task.state())
        return states

    # -- mechanics ---------------------------------------------------------------------

    def _load_task(self, task_id: str, version: int | None = None) -> Task:
        try:
            task: Task = self.app.repository.get(task_uuid(self.tenant, task_id), version=version)
        except AggregateNotFoundError:
            raise TaskNotFound(task_id) from None
        return task

    def _load_agent(self, agent_id: str, version: int | None = None) -> Agent:
        try:
            agent: Agent = self.app.repository.get(agent_uuid(self.tenant, agent_id), version=version)
        except AggregateNotFoundError:
            raise AgentNotFound(agent_id) from None
        return agent

    def _load_agents(self) -> dict[str, Agent]:
        return {agent_id: self._load_agent(agent_id) for agent_id in self.log_index.agent_ids()}

    def _save_atomically(self, *aggregates: Task | Agent) -> None:
        """Save in one atomic write; a stale version of any of them raises IntegrityError."""
        changed = [aggregate for aggregate in aggregates if aggregate.pending_events]
        if changed:
            self.app.save(*changed)
        for aggregate in aggregates:
            if isinstance(aggregate, Task):
                self._note_final(aggregate)

    def _note_final(self, task: Task) -> None:
        if task.task_status in (TaskStatus.COMPLETED, TaskStatus.ESCALATED):
            self.log_index.closed(task.id)

    def _task_write(self, task_id: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` under the task's in-process lock, retried on concurrent writes."""
        with self._lock(task_key(task_id)):
            return self._retrying(task_id, attempt)

    def _assignment_write(self, task_id: str, attempt: Callable[[], T]) -> T:
        """Like ``_task_write``, with a larger budget: assignments race for a handful of
        agents by nature, and every race one of them loses is one another assigner won."""
        attempts = (self.settings.max_conflict_retries + 1) * ASSIGNMENT_RETRY_FACTOR
        retrying = Retrying(
            retry=retry_if_exception_type(IntegrityError),
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=0.002, max=0.05),
        )
        with self._lock(task_key(task_id)):
            try:
                return retrying(attempt)
            except RetryError:
                raise ConcurrentUpdate(task_id, attempts) from None

    def _escalate(
        self,
        task: Task,
        reason: EscalationReason,
        detail: str,
        at: datetime,
        usage: LlmUsage | None = None,
    ) -> None:
        """Escalate the task and free its agent, if it had one, in one write."""
        holder = task.escalate(reason, detail, at, usage)
        if holder is None:
            self._save_atomically(task)
            return
        agent = self._load_agent(holder)
        agent.release(task.task_id, ReleaseOutcome.ESCALATED, at, None)
        self._save_atomically(task, agent)
