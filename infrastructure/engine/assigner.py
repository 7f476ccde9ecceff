"""Assigning tasks in batches: concurrent assigners of one engine are decided together.

Every assignment wants the least-loaded capable agent, so assigners that decide apart,
from the same roster, all pick the same agent and all but one lose the save. Here each
caller queues its request; one of the waiting callers (the leader) takes every queued
request, reads the roster once, decides them in queue order against a roster it updates
as it goes, and saves all the tasks and agents in one atomic append (the store's unit of
work); the others wait for their answer. No two assigners of one engine fight, and an
engine pays one roster read and one commit per batch instead of per task.

Across engines (processes), with ``agent_locks`` (PostgreSQL advisory locks), a batch
first plans its choices on the roster as read, then locks those agents in one round trip
(an agent another engine holds gives way to the next best), with the events they have
that this engine has not seen, so it decides on each held agent as it stands and its save
does not lose on the agent's version. It chooses among the agents it holds, reaching for
another only when none of them can take a task. The locks live in a transaction that the
batch's append commits (one round trip, and no unlock). Blocking on a lock happens only
while holding none (so engines cannot deadlock); a batch that would have to wait while
holding some stops there, and its other requests go to the next batch. An engine takes
the locks only while it sees another engine assigning (``CONTENDED_S``).

Without locks (in memory, or an engine alone) the agents' versions settle it: a batch
that read an agent stale loses its append as a whole and is decided again on a fresh
roster (and, on PostgreSQL, with locks from then on). Capacity holds either way
(``Agent.accept`` refuses, and a stale save fails on its version).

A batch that fails for another reason (a task that does not exist, say) is retried one
request at a time, so each caller gets its own answer or its own error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from flowledger.domain.agent import Agent
from flowledger.domain.assignment import AgentProfile, Choice, NoChoice, choose_agent, covers, rank_candidates
from flowledger.domain.errors import FlowledgerError
from flowledger.domain.task import Task
from flowledger.domain.task_views import EscalationReason, TaskState, TaskStatus
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_reads import TaskReads, task_key
from flowledger.infrastructure.postgres.agent_locks import AgentLocks

MAX_BATCH = 64
"""Requests decided in one append; more wait for the next batch."""

ROSTER_MAX_AGE_S = 0.5
"""How old a roster may be for a positive decision. The engine follows every agent it saves
itself (``TaskService`` listens to the store's saves); only other engines' changes need the
log, and missing them costs a lost save (the agent's version moved on: the batch is decided
again on a fresh roster) or, with agent locks, one read of the agent's newer events, never
capacity. A negative decision (escalate, or wait for capacity) always reads the log first."""

CONTENDED_S = 0.5
"""How long after a sign of another engine assigning (see ``_contended``) batches keep taking
agent locks; an engine's first batch counts as such a sign, so engines that start together
do not lose saves to each other. An engine alone then saves without them: they cost it a
round trip per batch, and capacity holds on the agents' versions all the same."""

ROSTER_KEY = "roster"
"""The store's lock key for a batch (tasks of a batch are not locked one by one)."""

Escalate = Callable[[UnitOfWork, Task, EscalationReason, str], None]


class _NeedsFreshRoster(Exception):
    """A negative decision was about to be made from a roster that was not read just now."""


@dataclass(eq=False)
class _Request:
    task_id: str
    escalate_when_full: bool
    done: bool = False
    state: TaskState | None = None
    error: BaseException | None = None


class BatchAssigner:
    """Assigns one tenant's tasks, batching concurrent requests (see the module docstring)."""

    def __init__(
        self,
        store: AggregateStore,
        reads: TaskReads,
        escalate: Escalate,
        *,
        conflict_retries: int,
        agent_locks: AgentLocks | None = None,
    ) -> None:
        self._store = store
        self._reads = reads
        self._escalate = escalate
        self._retries = conflict_retries
        self._locks = agent_locks
        self._active: AgentLocks | None = None
        """The locks this attempt takes: ``agent_locks`` while another engine is assigning, else None."""
        self._contended_until = float("-inf")
        self._foreign_seen = 0
        self._held: set[str] = set()
        self._taken: set[str] = set()
        """Agents found locked by another engine in this attempt."""
        self._cv = threading.Condition()
        self._queue: list[_Request] = []
        self._leading = False
        self.batches = 0
        """Appends made (a batch counts once however many tasks it assigned)."""

    def assign(self, task_id: str, escalate_when_full: bool) -> TaskState:
        """Assign one task (batched with concurrent callers'); see ``TaskService.assign_task``."""
        return self.assign_all([task_id], escalate_when_full)[0]

    def assign_all(self, task_ids: list[str], escalate_when_full: bool) -> list[TaskState]:
        """Assign tasks in the order given (batched with concurrent callers'); the first
        error met is raised after every request is answered."""
        requests = [_Request(task_id, escalate_when_full) for task_id in task_ids]
        with self._cv:
            self._queue.extend(requests)
            while not all(request.done for request in requests):
                if self._leading:
                    self._cv.wait()
                    continue
                self._leading = True
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._cv.release()
                try:
                    self._run(batch)
                finally:
                    self._cv.acquire()
                    self._leading = False
                    self._cv.notify_all()
        for request in requests:
            if request.error is not None:
                raise request.error
        return [request.state for request in requests if request.state is not None]

    def _run(self, batch: list[_Request]) -> None:
        try:
            states = self._write(batch)
        except FlowledgerError as error:
            if len(batch) == 1:
                self._finish(batch[0], None, error)
                return
            for request in batch:  # one at a time, so each caller gets its own error
                try:
                    (state,) = self._write([request])
                    self._finish(request, state, None)
                except BaseException as single:  # handed to its caller, re-raised there
                    self._finish(request, None, single)
            return
        except BaseException as error:
            for request in batch:
                self._finish(request, None, error)
            return
        for request, state in zip(batch, states, strict=False):
            self._finish(request, state, None)
        if len(states) < len(batch):  # stopped rather than wait on a lock: the rest go next
            with self._cv:
                self._queue[:0] = batch[len(states) :]

    def _finish(self, request: _Request, state: TaskState | None, error: BaseException | None) -> None:
        request.state, request.error, request.done = state, error, True
        if state is not None:
            self._reads.note(state)

    def _write(self, batch: list[_Request]) -> list[TaskState]:
        # The tasks' own locks too: a batch must not change a task another command of this
        # engine is changing (they share the store's cached copy).
        with self._store.locked(task_key(r.task_id) for r in batch):
            try:
                try:
                    return self._write_once(batch, fresh=False)
                except _NeedsFreshRoster:
                    return self._write_once(batch, fresh=True)
            finally:
                self._release()

    def _release(self) -> None:
        """Release every agent lock (a no-op once the batch's append committed them away)."""
        if self._active is not None:
            self._active.end()
        self._held.clear()
        self._taken.clear()

    def _write_once(self, batch: list[_Request], *, fresh: bool) -> list[TaskState]:
        attempts: list[UnitOfWork] = []

        def decide(uow: UnitOfWork) -> list[TaskState]:
            # A retry follows a lost save: read the log before deciding again.
            again = bool(attempts)
            attempts.append(uow)
            self._release()  # a lost save rolled back the locks' transaction: start afresh
            if again:
                self._contend()
            self._active = self._locks if self._contended() else None
            states = self._decide(batch, uow, fresh=fresh or again)
            if self._active is not None:
                uow.transaction = self._active.transaction  # the commit releases the locks
            return states

        states: list[TaskState] = self._store.write(ROSTER_KEY, decide, conflict_retries=self._retries)
        self.batches += 1
        return states

    def _decide(self, batch: list[_Request], uow: UnitOfWork, *, fresh: bool) -> list[TaskState]:
        index = self._reads.index
        roster = index.agent_profiles() if fresh else index.recent_agent_profiles(ROSTER_MAX_AGE_S)
        profiles = {p.agent_id: p for p in roster}
        now = uow.now
        if self._active is not None:
            self._lock_planned(self._active, batch, profiles, uow)
        tasks = [self._reads.task(uow, request.task_id) for request in batch]
        states = []
        for request, task in zip(batch, tasks, strict=True):
            if task.task_status is not TaskStatus.PENDING:
                states.append(task.state())
                continue
            if task.is_overdue(now):
                deadline = task.deadline.isoformat() if task.deadline else "?"
                detail = f"deadline {deadline} passed before assignment"
                self._escalate(uow, task, EscalationReason.DEADLINE_BREACHED, detail)
                states.append(task.state())
                continue
            decision = self._choose(task, profiles, uow)
            if decision is None:
                break  # every capable agent is locked elsewhere and this batch holds some
            if isinstance(decision, Choice):
                agent = self._open(uow, decision.agent_id, profiles, locked=False)
                agent.accept(task.task_id, now)
                profiles[decision.agent_id] = agent.profile()
                task.assign(decision, now)
            elif not fresh:
                raise _NeedsFreshRoster()  # the store drops what this attempt changed
            elif request.escalate_when_full or decision.reason is not EscalationReason.ALL_AT_CAPACITY:
                self._escalate(uow, task, decision.reason, decision.detail)
            states.append(task.state())
        return states

    def _lock_planned(
        self, locks: AgentLocks, batch: list[_Request], profiles: dict[str, AgentProfile], uow: UnitOfWork
    ) -> None:
        """Lock, in one round trip, the agents this batch means to use: its choices made on
        the roster as read, then the other eligible agents best first, up to as many as it
        chose (an agent another engine holds gives way to the next). Each agent taken is
        opened at once: its fresh load may change the choices. The batch's tasks this engine
        has not seen (another process created them) are read in the same round trip, planned
        from what the log index knows of them."""
        index = self._reads.index
        pending: list[tuple[str, Sequence[str]]] = []
        unseen: list[UUID] = []
        for request in batch:
            aggregate_id = self._reads.task_uuid(request.task_id)
            entry = index.task_entry(aggregate_id)
            if entry is not None and self._store.cached(aggregate_id) is None:
                unseen.append(aggregate_id)
                pending.append((request.task_id, entry.required_skills))
                continue
            task = self._reads.task(uow, request.task_id)
            if task.task_status is TaskStatus.PENDING:
                pending.append((task.task_id, task.required_skills))
        trial = dict(profiles)
        plan: list[str] = []
        for task_id, skills in pending:
            decision = choose_agent(task_id, skills, trial.values())
            if isinstance(decision, Choice):
                chosen = trial[decision.agent_id]
                trial[chosen.agent_id] = replace(chosen, load=chosen.load + 1)
                if chosen.agent_id not in plan:
                    plan.append(chosen.agent_id)
        if not plan:
            return
        order = list(plan)
        for task_id, skills in pending:
            order += [p.agent_id for p in rank_candidates(task_id, skills, trial.values())]
        ids = {self._reads.agent_uuid(agent_id): agent_id for agent_id in dict.fromkeys(order)}
        known = [(agent, index.agent_version(agent_id)) for agent, agent_id in ids.items()]
        taken, elsewhere = locks.try_lock(known, wanted=len(plan), streams=unseen)
        mapper = self._store.app.mapper
        for aggregate_id, stored in locks.streams.items():
            if aggregate_id not in uow.touched:  # a task missing here is read (or not found) as usual
                replayed: Any = None
                for event in stored:
                    decoded: Any = mapper.to_domain_event(event)
                    replayed = decoded.mutate(replayed)
                uow.adopt(replayed)
        if elsewhere:
            self._contend()
        self._taken.update(ids[agent] for agent in elsewhere)
        for agent in taken:
            self._held.add(ids[agent])
            self._open(uow, ids[agent], profiles, locked=True)

    def _choose(
        self, task: Task, profiles: dict[str, AgentProfile], uow: UnitOfWork
    ) -> Choice | NoChoice | None:
        """The best agent for the task whose lock this engine holds (or no locks are used);
        None when only agents locked elsewhere could take it and this batch holds locks."""
        locks = self._active
        if locks is not None and self._held:
            # Among the agents already held first: any other's load may be staler than theirs,
            # and reaching for it costs a round trip and, often, the lock of another engine.
            decision = choose_agent(task.task_id, task.required_skills, [profiles[a] for a in self._held])
            if isinstance(decision, Choice):
                return decision
        while True:
            candidates = [p for p in profiles.values() if p.agent_id not in self._taken]
            decision = choose_agent(task.task_id, task.required_skills, candidates)
            if isinstance(decision, Choice):
                agent_id = decision.agent_id
                aggregate_id = self._reads.agent_uuid(agent_id)
                if locks is None or aggregate_id in uow.touched:
                    return decision
                if agent_id not in self._held:
                    if not locks.try_lock([(aggregate_id, self._reads.index.agent_version(agent_id))])[0]:
                        self._contend()
                        self._taken.add(agent_id)
                        continue
                    self._held.add(agent_id)
                # its fresh load may change the choice
                self._open(uow, agent_id, profiles, locked=True)
                continue
            blocked = [
                profiles[a]
                for a in self._taken
                if profiles[a].has_room and covers(task.required_skills, profiles[a].skills)
            ]
            if not blocked or locks is None:
                return decision
            if self._held:
                return None
            # Holding no lock, waiting for one cannot deadlock: wait for the best of them.
            best = choose_agent(task.task_id, task.required_skills, blocked)
            assert isinstance(best, Choice)  # they are eligible
            locks.lock(self._reads.agent_uuid(best.agent_id), self._reads.index.agent_version(best.agent_id))
            self._held.add(best.agent_id)
            self._taken.discard(best.agent_id)
            self._open(uow, best.agent_id, profiles, locked=True)

    def _open(
        self, uow: UnitOfWork, agent_id: str, profiles: dict[str, AgentProfile], *, locked: bool
    ) -> Agent:
        """The agent, opened for this attempt; when locked, caught up with its newer events
        (those its lock brought, else read from the store)."""
        aggregate_id = self._reads.agent_uuid(agent_id)
        opened = uow.touched.get(aggregate_id)
        if isinstance(opened, Agent):
            return opened
        agent = self._reads.index.agent_copy(agent_id)
        if locked:
            for event in self._newer_events(aggregate_id, agent.version):
                event.mutate(agent)
        uow.adopt(agent)
        profiles[agent_id] = agent.profile()
        return agent

    def _contend(self) -> None:
        self._contended_until = time.monotonic() + CONTENDED_S

    def _contended(self) -> bool:
        """Whether another engine was seen assigning lately: its agent events in the log, an
        agent it held, events it wrote that a lock brought, a save lost to it."""
        if self._locks is None:
            return False
        seen = self._reads.index.foreign_agent_changes
        if seen != self._foreign_seen or self.batches == 0:
            self._foreign_seen = seen
            self._contend()
        return time.monotonic() < self._contended_until

    def _newer_events(self, aggregate_id: UUID, version: int) -> list[Any]:
        brought = self._active.held.get(aggregate_id) if self._active is not None else None
        if brought is not None:
            newer = [stored for stored in brought if stored.originator_version > version]
            if newer:
                self._contend()  # another engine wrote the agent
            if not newer or newer[0].originator_version == version + 1:
                mapper = self._store.app.mapper
                return [mapper.to_domain_event(stored) for stored in newer]
        return self._store.events(aggregate_id, gt=version)
