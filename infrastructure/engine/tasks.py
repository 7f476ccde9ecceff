"""The Engine's task and agent commands: register, create, classify, assign, work, escalate.

A command that changes a task and its agent saves both in one atomic ``app.save(task,
agent)``; each is written at its next version, so a writer that read either one stale
loses on the unique (id, version) key and retries against fresh state. That is what keeps
every agent's load within its capacity however many assigners run, in however many
processes. In-process, writers of one task are serialised by the engine's lock for that task;
agents are not locked: concurrent assigners race on them optimistically.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from flowledger.domain.agent import Agent, normalise_skills
from flowledger.domain.assignment import Choice, choose_agent, in_queue_order
from flowledger.domain.errors import AgentNotFound, TaskNotFound, ValidationError
from flowledger.domain.task import Task
from flowledger.domain.task_views import (
    AgentState,
    EscalationReason,
    ReleaseOutcome,
    TaskState,
    TaskStatus,
)
from flowledger.domain.values import JsonObject
from flowledger.infrastructure.engine.classification import TaskClassification
from flowledger.infrastructure.engine.task_reads import agent_key


class TaskCommands(TaskClassification):
    """Mixed into Engine (see TaskQueries for what the Engine provides)."""

    def register_agent(self, agent_id: str, name: str, skills: Iterable[str], capacity: int) -> AgentState:
        """Register an agent; registering it again with the same fields is a no-op."""
        skills = normalise_skills("skills", skills)

        def register() -> AgentState:
            try:
                existing = self._load_agent(agent_id)
            except AgentNotFound:
                agent = Agent.register(
                    agent_id=agent_id,
                    tenant=self.tenant,
                    name=name,
                    skills=skills,
                    capacity=capacity,
                )
                self._save_atomically(agent)
                return agent.state()
            existing.ensure_same(name=name, skills=skills, capacity=capacity)
            return existing.state()

        with self._lock(agent_key(agent_id)):
            return self._retrying(agent_id, register)

    def set_agent_capacity(self, agent_id: str, capacity: int) -> AgentState:
        """Change an agent's capacity (refused below its current load)."""

        def change() -> AgentState:
            agent = self._load_agent(agent_id)
            agent.change_capacity(capacity)
            self._save_atomically(agent)
            return agent.state()

        with self._lock(agent_key(agent_id)):
            return self._retrying(agent_id, change)

    def create_task(
        self,
        task_id: str,
        description: str,
        required_skills: Iterable[str] = (),
        priority: str = "medium",
        deadline: datetime | timedelta | None = None,
    ) -> TaskState:
        """Queue a task; ``deadline`` is a moment or a delay from now. Creating it again with
        the same description, skills and priority returns it unchanged."""
        skills = normalise_skills("required_skills", required_skills)
        if isinstance(deadline, timedelta):
            if deadline <= timedelta(0):
                raise ValidationError("deadline", f"must be a positive delay, got {deadline}")
            deadline = self.clock() + deadline

        def create() -> TaskState:
            try:
                existing = self._load_task(task_id)
            except TaskNotFound:
                task = Task.create(
                    task_id=task_id,
                    tenant=self.tenant,
                    description=description,
                    required_skills=skills,
                    priority=priority,
                    deadline=deadline,
                )
                self._save_atomically(task)
                return task.state()
            existing.ensure_same(description=description, required_skills=skills, priority=priority)
            return existing.state()

        return self._task_write(task_id, create)

    def assign_task(self, task_id: str, *, escalate_when_full: bool = True) -> TaskState:
        """Give a waiting task to the best eligible agent, or escalate it with the reason.

        A task that is no longer waiting is returned unchanged. With
        ``escalate_when_full=False`` a task whose capable agents are all full keeps waiting.
        """

        def attempt() -> TaskState:
            with self.assignment_lock:
                return self._assign_once(task_id, escalate_when_full)

        return self._assignment_write(task_id, attempt)

    def assign_pending(self, *, limit: int | None = None, escalate_when_full: bool = True) -> list[TaskState]:
        """Assign waiting tasks in queue order (CRITICAL first, then earliest deadline)."""
        waiting = []
        for entry in self.log_index.open_tasks():
            task = self._load_task(entry.task_id)
            self._note_final(task)
            if task.task_status is TaskStatus.PENDING:
                waiting.append(task.queued())
        outcomes = []
        for queued in in_queue_order(waiting)[:limit]:

            def attempt(task_id: str = queued.task_id) -> TaskState:
                with self.assignment_lock:
                    return self._assign_once(task_id, escalate_when_full)

            outcomes.append(self._assignment_write(queued.task_id, attempt))
        return outcomes

    def start_task(self, task_id: str) -> TaskState:
        """The holding agent began work."""

        def start() -> TaskState:
            task = self._load_task(task_id)
            task.start(self.clock())
            self._save_atomically(task)
            return task.state()

        return self._task_write(task_id, start)

    def complete_task(self, task_id: str, result: JsonObject | None = None) -> TaskState:
        """Close the task as done and free its agent, in one write."""

        def complete() -> TaskState:
            task = self._load_task(task_id)
            holder, now = task.holder, self.clock()
            seconds = task.complete(result if result is not None else {}, now)
            agent = self._load_agent(holder or "")
            agent.release(task_id, ReleaseOutcome.COMPLETED, now, seconds)
            self._save_atomically(task, agent)
            return task.state()

        return self._task_write(task_id, complete)

    def release_task(self, task_id: str, reason: str = "released") -> TaskState:
        """Take the task back from its agent; it waits in the queue again."""

        def release() -> TaskState:
            task = self._load_task(task_id)
            now = self.clock()
            agent = self._load_agent(task.release(reason, now))
            agent.release(task_id, ReleaseOutcome.RELEASED, now, None)
            self._save_atomically(task, agent)
            return task.state()

        return self._task_write(task_id, release)

    def escalate_overdue(self, now: datetime | None = None) -> list[TaskState]:
        """Escalate every open task whose deadline passed (each once); returns those escalated."""
        at = now if now is not None else self.clock()
        if at.tzinfo is None:
            raise ValidationError("now", "must be timezone-aware")
        escalated = []
        for entry in self.log_index.overdue_tasks(at):

            def sweep(task_id: str = entry.task_id) -> TaskState | None:
                task = self._load_task(task_id)
                if not task.is_overdue(at):
                    self._note_final(task)
                    return None
                deadline = task.deadline.isoformat() if task.deadline else "?"
                self._escalate(task, EscalationReason.DEADLINE_BREACHED, f"deadline {deadline} passed", at)
                return task.state()

            state = self._task_write(entry.task_id, sweep)
            if state is not None:
                escalated.append(state)
        return escalated

    # -- mechanics ---------------------------------------------------------------------

    def _assign_once(self, task_id: str, escalate_when_full: bool) -> TaskState:
        task = self._load_task(task_id)
        if task.task_status is not TaskStatus.PENDING:
            self._note_final(task)
            return task.state()
        now = self.clock()
        if task.is_overdue(now):
            deadline = task.deadline.isoformat() if task.deadline else "?"
            self._escalate(
                task, EscalationReason.DEADLINE_BREACHED, f"deadline {deadline} passed before assignment", now
            )
            return task.state()
        # The roster comes from the log index (one query); if it lags, saving the chosen
        # agent fails on its version and this attempt is retried on a fresher roster.
        decision = choose_agent(task.task_id, task.required_skills, self.log_index.agent_profiles())
        if isinstance(decision, Choice):
            agent = self.log_index.agent_copy(decision.agent_id)
            agent.accept(task.task_id, now)
            task.assign(decision, now)
            self._save_atomically(task, agent)
        elif escalate_when_full or decision.reason is not EscalationReason.ALL_AT_CAPACITY:
            self._escalate(task, decision.reason, decision.detail, now)
        return task.state()
