"""Task and agent use cases: register, create, assign, work, release, escalate.

A command that changes a task and its agent saves both in one atomic append (the
store's unit of work); each is written at its next version, so a writer that read either
one stale loses on the unique (id, version) key and retries against fresh state. That is
what keeps every agent's load within its capacity however many assigners run, in however
many processes. In one process, writers of one task are serialised by the store's lock
for that task, and assignments are decided in batches (``assigner.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from flowledger.domain.agent import SEED_CAPACITY, Agent, normalise_skills, require_registration
from flowledger.domain.assignment import queue_window
from flowledger.domain.bounds import MAX_REASON_LENGTH, require_flag, require_resolution
from flowledger.domain.errors import ValidationError
from flowledger.domain.skill_aliases import SkillAliases
from flowledger.domain.task import Task
from flowledger.domain.task_assignment_ref import ANY_ASSIGNMENT, AssignmentRef
from flowledger.domain.task_checks import require_limit, require_requeue_terms
from flowledger.domain.task_views import (
    AgentState,
    EscalationReason,
    ReleaseOutcome,
    TaskPriority,
    TaskState,
    TaskStatus,
)
from flowledger.domain.values import (
    JsonObject,
    LlmUsage,
    require_deadline,
    require_moment,
    require_text,
)
from flowledger.infrastructure.engine.assigner import BatchAssigner
from flowledger.infrastructure.engine.classify_first import classified_first
from flowledger.infrastructure.engine.ranking import Ranking
from flowledger.infrastructure.engine.returned_routing import ReturnedRouting
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_keys import (
    AskedRequeue,
    TaskCommandKey,
    last_changes,
    last_command,
    release_words,
    requeue_words,
)
from flowledger.infrastructure.engine.task_reads import TaskReads, agent_key, task_key
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks

S = TypeVar("S", TaskState, TaskState | None, "Creation")

ASSIGNMENT_RETRY_FACTOR = 8
"""Assignments race for a handful of agents by nature: they get this many times the budget."""


@dataclass(frozen=True, kw_only=True)
class Creation:
    """What ``create_or_get_task`` did: ``created`` the task, or found it created with the same
    fields (nothing appended: a client's retry)."""

    state: TaskState
    created: bool


@dataclass(frozen=True, kw_only=True)
class Registration:
    """What ``register_or_get_agent`` did: ``created`` the agent, or found it registered with
    the same fields (nothing appended)."""

    state: AgentState
    created: bool


class TaskService:
    """Commands on one tenant's tasks and agents."""

    def __init__(
        self,
        store: AggregateStore,
        reads: TaskReads,
        tenant: str,
        returned: ReturnedRouting,
        agent_locks: AgentLocks | AgentLockLender | None = None,
        aliases: SkillAliases | None = None,
    ) -> None:
        """``aliases``: the skill catalogue's other spellings of skills, which the assignment
        policy compares skills through (``Needs.spelt``)."""
        self._store = store
        self._reads = reads
        self._tenant = tenant
        self._returned = returned  # applies a classification made while the task was held
        budget = (store.settings.max_conflict_retries + 1) * ASSIGNMENT_RETRY_FACTOR
        self.assigner = BatchAssigner(
            store,
            reads,
            lambda uow, task, reason, detail, usage: self.escalate(uow, task, reason, detail, uow.now, usage),
            conflict_retries=budget,
            agent_locks=agent_locks,
            aliases=aliases,
        )
        # The roster follows this engine's own agent saves at once; other engines' by the log.
        store.saved_listeners.append(self._follow)

    def register_agent(
        self, agent_id: str, name: str, skills: Iterable[str], capacity: int = SEED_CAPACITY
    ) -> AgentState:
        """Register an agent (at least one skill, capacity at least 1); registering it again
        with the same fields is a no-op.

        Every field is checked first, so that a repeat with an invalid one is a ValidationError,
        not an AgentConflict from the comparison with the registered agent.
        """
        return self.register_or_get_agent(agent_id, name, skills, capacity).state

    def register_or_get_agent(
        self, agent_id: str, name: str, skills: Iterable[str], capacity: int = SEED_CAPACITY
    ) -> Registration:
        """``register_agent``, saying whether it registered the agent or found it registered."""
        normalised, capacity = require_registration(name, skills, capacity)
        decide = partial(self._register, agent_id, name, normalised, capacity)
        return self._store.write(agent_key(agent_id), decide)

    def set_agent_capacity(self, agent_id: str, capacity: int) -> AgentState:
        """Change an agent's capacity (refused below its current load)."""
        return self._store.write(agent_key(agent_id), partial(self._change_capacity, agent_id, capacity))

    def create_task(
        self,
        task_id: str,
        description: str,
        required_skills: Iterable[str] = (),
        priority: str = "medium",
        deadline: datetime | timedelta | None = None,
    ) -> TaskState:
        """Queue a task; ``deadline`` is a moment or a delay from now, at most ``MAX_DEADLINE``
        ahead either way. Creating it again with the same description, skills and priority
        returns it unchanged (every field is checked first: a repeat with an invalid one is
        refused, not compared and let through)."""
        return self.create_or_get_task(task_id, description, required_skills, priority, deadline).state

    def create_or_get_task(
        self,
        task_id: str,
        description: str,
        required_skills: Iterable[str] = (),
        priority: str = "medium",
        deadline: datetime | timedelta | None = None,
    ) -> Creation:
        """``create_task``, saying whether it created the task or found it created."""
        skills = normalise_skills("required_skills", required_skills)
        require_text("description", description, visible=True)
        TaskPriority.parse(priority)
        moment = require_deadline("deadline", deadline, self._store.clock())
        # A delay is compared as a delay (a retry later is a repeat), a moment as checked.
        given = deadline if isinstance(deadline, timedelta) else moment
        decide = partial(self._create, task_id, description, skills, priority, moment, given)
        return self._task_write(task_id, decide)

    def assign_task(
        self,
        task_id: str,
        *,
        escalate_when_full: bool = True,
        ranking: Ranking | None = None,
        unclassified: str | None = None,
    ) -> TaskState:
        """Give a waiting task to the best eligible agent, or escalate it with the reason.

        A task that is no longer waiting is returned unchanged; one held back (no skills,
        and its classification failed) is refused with TaskNeedsClassification. With
        ``escalate_when_full=False`` a task whose capable agents are all full keeps waiting.
        ``ranking``: a model's pick among tied agents, with its call's usage (``ranking.py``).
        ``unclassified`` (a routed assignment): a task that names no skills and was never
        classified is refused too (TaskNeedsClassification), saying this; None: it goes to
        any agent with room.
        """
        require_flag("escalate_when_full", escalate_when_full)
        return self.assigner.assign(task_id, escalate_when_full, ranking, unclassified)

    def assign_pending(
        self, *, limit: int | None = None, escalate_when_full: bool = False, unclassified: str | None = None
    ) -> list[TaskState]:
        """Assign waiting tasks in queue order (CRITICAL first, then earliest deadline).

        Every waiting task is offered again, including those that waited for capacity and
        requeued ones: run it when agents free up. A task whose capable agents are all full
        keeps waiting for the next run (as ``POST /v1/queue/run`` does), its ``waiting``
        saying why and taking no place of ``limit`` (the tasks behind it are offered); with
        ``escalate_when_full=True`` it is escalated (``all_at_capacity``) instead. A task
        held back (``TaskState.held_back``: no skills, and its classification failed) is
        passed over and returned as it stands, without counting towards ``limit``: at most
        ``MAX_LIST`` (1,000), REST's bound, so the CLI and the library answer as it does.
        ``unclassified`` (a routed run, ``assign_pending_routed``: classification drives
        routing): a task that names no skills and was never classified (no model to classify
        it, or it arrived after the run's last look) is held back as a failed classification
        holds one, ``unclassified`` saying why, rather than given to any agent with room; one
        past its deadline is offered, and escalated unclassified (``classified_first``).
        """
        require_queue_run(limit, escalate_when_full)
        waiting, held = [], set()
        now = self._store.clock()
        for _, task in self._reads.loaded(self._reads.index.open_tasks()):
            if task is None:
                continue
            state = task.state()
            self._reads.note(state)
            if task.task_status is TaskStatus.PENDING:
                waiting.append(task.queued())
                if task.held_back is not None or (unclassified is not None and classified_first(state, now)):
                    held.add(task.task_id)
        window = queue_window(waiting, held, limit)
        states = self.assigner.assign_all(window, escalate_when_full, unclassified)
        # A task left waiting for capacity takes no place of the limit either, as a held-back
        # one does: with limit=1 and the first task's agents full, every run offered it alone
        # and placed nothing while an agent for the next stood idle. Offer those behind it.
        offered = set(window)
        while limit is not None and any(state.waiting for state in states):
            held |= {state.task_id for state in states if state.waiting}
            behind = [task_id for task_id in queue_window(waiting, held, limit) if task_id not in offered]
            if not behind:
                break
            offered.update(behind)
            states += self.assigner.assign_all(behind, escalate_when_full, unclassified)
        return states

    def requeue_task(
        self,
        task_id: str,
        requested_by: str,
        reason: str,
        deadline: datetime | timedelta | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> TaskState:
        """A person sends an escalated task back to the queue (who and why are recorded), with
        a new deadline (a moment, or a delay from now): required once the old one has passed
        (ValidationError on ``deadline`` otherwise, nothing recorded), optional before.
        ``idempotency_key``: sent again, answered with the task as the first send left it
        (the task may have been escalated again since: that is for a person to requeue)."""
        require_requeue_terms(requested_by, reason)  # before the task's state, as REST's body
        moment = require_deadline("deadline", deadline, self._store.clock())
        # A retry is the same person, reason and deadline; a delay counts from each send,
        # so only a moment is compared as given.
        asked = AskedRequeue(requested_by, reason, moment, exact=isinstance(deadline, datetime))
        key = TaskCommandKey.of("requeue", idempotency_key, requeue_words(requested_by, reason))
        return self._task_write(task_id, partial(self._requeue, task_id, asked, key), key)

    def start_task(
        self, task_id: str, *, agent_id: str | None = None, assignment: int | None = None
    ) -> TaskState:
        """The holding agent began work. ``agent_id`` / ``assignment`` (the task's
        ``times_assigned`` when it was assigned) name the assignment meant: another one is
        refused (TaskAssignmentChanged), nothing recorded."""
        ref = AssignmentRef.of(agent_id, assignment)
        return self._task_write(task_id, partial(self._start, task_id, ref))

    def complete_task(
        self,
        task_id: str,
        resolution: JsonObject | str | None = None,
        *,
        result: JsonObject | None = None,
        agent_id: str | None = None,
        assignment: int | None = None,
    ) -> TaskState:
        """Close the task as done with its resolution and free its agent, in one write: a JSON
        object, or text kept as ``{"resolution": text}``, by a session's rule
        (``require_resolution``; none is ``{}``). ``result`` is the name it had before.
        ``agent_id`` / ``assignment`` name the assignment meant, as for ``start_task``."""
        if resolution is not None and result is not None:
            raise ValidationError("resolution", "give resolution or result (its name before), not both")
        given = resolution if resolution is not None else result
        outcome = {} if given is None else require_resolution(given)
        ref = AssignmentRef.of(agent_id, assignment)
        return self._task_write(task_id, partial(self._complete, task_id, outcome, ref))

    def release_task(
        self,
        task_id: str,
        reason: str = "released",
        *,
        agent_id: str | None = None,
        assignment: int | None = None,
        idempotency_key: str | None = None,
    ) -> TaskState:
        """Take the task back from its agent; it waits in the queue again. ``agent_id`` /
        ``assignment`` name the assignment meant, as for ``start_task``; ``idempotency_key``:
        sent again, answered with the task as the first send left it, nothing recorded, even
        once a queue run has assigned it again (the key with another reason, or naming
        another command of the task: TaskIdempotencyKeyReused)."""
        # Checked before the task's state, as REST's body is: a blank reason for a waiting task
        # was a 409 ("it is pending") here and a 422 there.
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        ref = AssignmentRef.of(agent_id, assignment)
        key = TaskCommandKey.of("release", idempotency_key, release_words(reason))
        return self._task_write(task_id, partial(self._release, task_id, reason, ref, key), key)

    def escalate_overdue(self, now: datetime | None = None) -> list[TaskState]:
        """Escalate every open task whose deadline passed (each once); returns those escalated."""
        at = now if now is not None else self._store.clock()
        require_moment("now", at)
        escalated = []
        for entry in self._reads.index.overdue_tasks(at):
            state = self._task_write(entry.task_id, partial(self._sweep, entry.task_id, at))
            if state is not None:
                escalated.append(state)
        return escalated

    def escalate(
        self,
        uow: UnitOfWork,
        task: Task,
        reason: EscalationReason,
        detail: str,
        at: datetime,
        usage: LlmUsage | None = None,
    ) -> None:
        """Escalate the task and free its agent, if it had one, in the same unit of work."""
        holder = task.escalate(reason, detail, at, usage)
        if holder is not None:
            self._reads.agent(uow, holder).release(task.task_id, ReleaseOutcome.ESCALATED, at, None)

    def close(self) -> None:
        """Stop following the store's saves (the store may outlive this service: ``for_tenant``)."""
        if self._follow in self._store.saved_listeners:
            self._store.saved_listeners.remove(self._follow)

    def _follow(self, aggregate: object) -> None:
        if isinstance(aggregate, Agent):
            self._reads.index.remember(aggregate)

    def _task_write(
        self, task_id: str, decide: Callable[[UnitOfWork], S], key: TaskCommandKey | None = None
    ) -> S:
        command_id = None if key is None else key.command_id
        state = self._store.write(task_key(task_id), decide, command_id=command_id)
        if isinstance(state, TaskState):
            self._reads.note(state)
        elif isinstance(state, Creation):
            self._reads.note(state.state)
        return state

    # -- decisions (run by the store, once per attempt) ----------------------------------

    def _register(
        self, agent_id: str, name: str, skills: list[str], capacity: int, uow: UnitOfWork
    ) -> Registration:
        existing: Agent | None = uow.find(self._reads.agent_uuid(agent_id))
        if existing is not None:
            existing.ensure_same(name=name, skills=skills, capacity=capacity)
            return Registration(state=existing.state(), created=False)
        agent = Agent.register(
            agent_id=agent_id, tenant=self._tenant, name=name, skills=skills, capacity=capacity
        )
        uow.add(agent)
        return Registration(state=agent.state(), created=True)

    def _change_capacity(self, agent_id: str, capacity: int, uow: UnitOfWork) -> AgentState:
        agent = self._reads.agent(uow, agent_id)
        agent.change_capacity(capacity)
        return agent.state()

    def _create(
        self,
        task_id: str,
        description: str,
        skills: list[str],
        priority: str,
        deadline: datetime | None,
        given: datetime | timedelta | None,
        uow: UnitOfWork,
    ) -> Creation:
        existing: Task | None = uow.find(self._reads.task_uuid(task_id))
        if existing is not None:
            existing.ensure_same(
                description=description, required_skills=skills, priority=priority, deadline=given
            )
            return Creation(state=existing.state(), created=False)
        task = Task.create(
            task_id=task_id,
            tenant=self._tenant,
            description=description,
            required_skills=skills,
            priority=priority,
            deadline=deadline,
        )
        uow.add(task)
        return Creation(state=task.state(), created=True)

    def _requeue(
        self, task_id: str, asked: AskedRequeue, key: TaskCommandKey | None, uow: UnitOfWork
    ) -> TaskState:
        task = self._reads.task(uow, task_id)
        first = self._first_result(task, key)
        if first is not None:
            return first
        if key is None and task.task_status != TaskStatus.ESCALATED and self._requeued_as(task, asked):
            return task.state()  # a retry whose first answer was lost
        task.requeue(asked.requested_by, asked.reason, uow.now, asked.deadline)
        self._returned.apply(task, uow.now)
        return task.state()

    def _requeued_as(self, task: Task, asked: AskedRequeue) -> bool:
        """Whether the task's last requeue was ``asked`` (not escalated since: it would be
        escalated now, or requeued again by someone)."""
        last = next((e for e in reversed(self._store.events(task.id)) if isinstance(e, Task.Requeued)), None)
        return last is not None and asked.matches(last)

    def _start(self, task_id: str, ref: AssignmentRef, uow: UnitOfWork) -> TaskState:
        task = self._reads.task(uow, task_id)
        ref.require_current(task_id, "start", task.task_status, task.assignment, task.times_assigned)
        if task.task_status != TaskStatus.IN_PROGRESS:  # started already: a retry, answered as is
            task.start(uow.now)
        return task.state()

    def _complete(self, task_id: str, result: JsonObject, ref: AssignmentRef, uow: UnitOfWork) -> TaskState:
        task = self._reads.task(uow, task_id)
        done_by = task.assignment.agent_id if task.assignment else None
        if task.completed_with(result) and ref.fits(done_by, task.times_assigned):
            return task.state()  # a retry whose first answer was lost
        ref.require_current(task_id, "complete", task.task_status, task.assignment, task.times_assigned)
        holder = task.holder
        seconds = task.complete(result, uow.now)
        self._reads.agent(uow, holder or "").release(task_id, ReleaseOutcome.COMPLETED, uow.now, seconds)
        return task.state()

    def _release(
        self, task_id: str, reason: str, ref: AssignmentRef, key: TaskCommandKey | None, uow: UnitOfWork
    ) -> TaskState:
        task = self._reads.task(uow, task_id)
        first = self._first_result(task, key)
        if first is not None:
            return first
        # Without a key, a release like the last one is taken for its retry; under a key the
        # log says whether it was sent before: answered so, a key retried after a queue run
        # found nothing under it (the release answered was another caller's) and was refused.
        if key is None and task.task_status == TaskStatus.PENDING and self._released_for(task, reason, ref):
            return task.state()  # a retry whose first answer was lost
        ref.require_current(task_id, "release", task.task_status, task.assignment, task.times_assigned)
        agent = self._reads.agent(uow, task.release(reason, uow.now))
        agent.release(task_id, ReleaseOutcome.RELEASED, uow.now, None)
        self._returned.apply(task, uow.now)
        return task.state()

    def _released_for(self, task: Task, reason: str, ref: AssignmentRef = ANY_ASSIGNMENT) -> bool:
        """Whether the task's last event released it for exactly ``reason`` (nothing since),
        from the assignment ``ref`` names."""
        # The release's save may end with the classification it applied (``ReturnedRouting``).
        last = last_command(last_changes(partial(self._events_after, task), task.version))
        released = next((e for e in last if isinstance(e, Task.Released)), None)
        if released is None or released.reason != reason:
            return False
        return ref.fits(released.agent_id, task.times_assigned)

    def _events_after(self, task: Task, version: int) -> list[Any]:
        return self._store.events(task.id, gt=version)

    def _first_result(self, task: Task, key: TaskCommandKey | None) -> TaskState | None:
        """The task as the first send of the command under ``key`` left it, read from the log
        (None: no key, or not sent before)."""
        if key is None:
            return None
        version = key.first_version(task.task_id, self._store.events(task.id))
        return None if version is None else self._reads.get_task(task.task_id, version)

    def _sweep(self, task_id: str, at: datetime, uow: UnitOfWork) -> TaskState | None:
        task = self._reads.task(uow, task_id)
        if not task.is_overdue(at):
            self._reads.note(task.state())
            return None
        deadline = task.deadline.isoformat() if task.deadline else "?"
        self.escalate(uow, task, EscalationReason.DEADLINE_BREACHED, f"deadline {deadline} passed", at)
        return task.state()


def require_queue_run(limit: int | None, escalate_when_full: bool) -> None:
    """Raise ValidationError unless ``limit`` is None or a whole number in [1, ``MAX_LIST``] and
    ``escalate_when_full`` is True or False."""
    if limit is not None:
        require_limit(limit)
    require_flag("escalate_when_full", escalate_when_full)
