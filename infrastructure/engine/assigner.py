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
the locks only while it sees another engine assigning (``agent_claims.py``).

Without locks (in memory, or an engine alone) the agents' versions settle it: a batch
that read an agent stale loses its append as a whole and is decided again on a fresh
roster (and, on PostgreSQL, with locks from then on). Capacity holds either way
(``Agent.accept`` refuses, and a stale save fails on its version).

A batch that fails for another reason (a task that does not exist, say) is retried one
request at a time, so each caller gets its own answer or its own error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from flowledger.domain.assignment import Choice
from flowledger.domain.errors import FlowledgerError, TaskNeedsClassification
from flowledger.domain.skill_aliases import SkillAliases
from flowledger.domain.task import Task
from flowledger.domain.task_views import EscalationReason, TaskState, TaskStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.agent_claims import AgentClaims
from flowledger.infrastructure.engine.classify_first import needs_classifying
from flowledger.infrastructure.engine.ranking import Ranking
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_reads import TaskReads, task_key
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks

MAX_BATCH = 64
"""Requests decided in one append; more wait for the next batch."""

ROSTER_MAX_AGE_S = 0.5
"""How old a roster may be for a positive decision. The engine follows every agent it saves
itself (``TaskService`` listens to the store's saves); only other engines' changes need the
log, and missing them costs a lost save (the agent's version moved on: the batch is decided
again on a fresh roster) or, with agent locks, one read of the agent's newer events, never
capacity. A negative decision (escalate, or wait for capacity) always reads the log first."""

NEVER_CLASSIFIED = "never classified and it names no skills, so any agent with room may take it"
"""What an assignment's reason starts with for a task given to any agent for want of a
classification (``assign_task`` / ``assign_pending``, which call no model): it read "covers no
particular skills", as if the task were known to need none."""

ROSTER_KEY = "roster"
"""The store's lock key for a batch (tasks of a batch are not locked one by one)."""

Escalate = Callable[[UnitOfWork, Task, EscalationReason, str, LlmUsage | None], None]
"""Escalate a task in the batch's unit of work (reason, detail, and a ranking call's usage)."""


class _NeedsFreshRoster(Exception):
    """A negative decision was about to be made from a roster that was not read just now, or a
    task the batch was asked for was found taken on a cached copy."""


@dataclass(eq=False)
class _Request:
    task_id: str
    escalate_when_full: bool
    ranking: Ranking | None = None
    queue_run: bool = False
    """Part of a queue run, which passes over a task held back (``Task.held_back``); asked
    for by name, such a task is refused (TaskNeedsClassification)."""
    unclassified: str | None = None
    """Why a task that names no skills and was never classified may not be assigned (a routed
    run or assignment: classification drives routing), held back as a failed classification
    holds one; None: it goes to any agent with room (the library's synchronous commands)."""
    refusal: BaseException | None = None
    """An error to answer once the batch is saved: a refused request whose ranking call is
    recorded in the batch (``Task.RankingDiscarded``), where raising it would have lost it."""
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
        agent_locks: AgentLocks | AgentLockLender | None = None,
        aliases: SkillAliases | None = None,
    ) -> None:
        self._store = store
        self._reads = reads
        self._escalate = escalate
        self._retries = conflict_retries
        self._claims = AgentClaims(store, reads, agent_locks, aliases)
        self._cv = threading.Condition()
        self._queue: list[_Request] = []
        self._leading = False
        self.batches = 0
        """Appends made (a batch counts once however many tasks it assigned)."""

    def assign(
        self,
        task_id: str,
        escalate_when_full: bool,
        ranking: Ranking | None = None,
        unclassified: str | None = None,
    ) -> TaskState:
        """Assign one task (batched with concurrent callers'); see ``TaskService.assign_task``.
        ``ranking``: a model's pick among tied agents, and its call's usage (``ranking.py``);
        ``unclassified``: see ``_Request.unclassified``.
        The id is checked before it joins a batch, by the rule ids are looked up by (one stored
        before a later rule for new ids, a ``/`` in it, is still found): the agents' locks are
        planned on the batch's ids, where one that is no string failed every caller's request."""
        self._reads.task_uuid(task_id)
        return self._assign([_Request(task_id, escalate_when_full, ranking, unclassified=unclassified)])[0]

    def assign_all(
        self, task_ids: list[str], escalate_when_full: bool, unclassified: str | None = None
    ) -> list[TaskState]:
        """Assign tasks in the order given (batched with concurrent callers'); the first
        error met is raised after every request is answered. A task held back
        (``Task.held_back``, or ``unclassified``) is passed over and returned as it stands,
        its ``held_back`` saying why."""
        return self._assign(
            [_Request(t, escalate_when_full, queue_run=True, unclassified=unclassified) for t in task_ids]
        )

    def _assign(self, requests: list[_Request]) -> list[TaskState]:
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
                    self._answer(request, state)
                except BaseException as single:  # handed to its caller, re-raised there
                    self._finish(request, None, single)
            return
        except BaseException as error:
            for request in batch:
                self._finish(request, None, error)
            return
        for request, state in zip(batch, states, strict=False):
            self._answer(request, state)
        if len(states) < len(batch):  # stopped rather than wait on a lock: the rest go next
            with self._cv:
                self._queue[:0] = batch[len(states) :]

    def _answer(self, request: _Request, state: TaskState | None) -> None:
        """Answer a request its batch decided: its state, or the refusal it saved."""
        if request.refusal is not None:
            self._finish(request, None, request.refusal)
        else:
            self._finish(request, state, None)

    def _finish(self, request: _Request, state: TaskState | None, error: BaseException | None) -> None:
        request.state, request.error, request.done = state, error, True
        if state is not None:
            self._reads.note(state)

    def _write(self, batch: list[_Request]) -> list[TaskState | None]:
        # The tasks' own locks too: a batch must not change a task another command of this
        # engine is changing (they share the store's cached copy).
        with self._store.locked(task_key(r.task_id) for r in batch):
            try:
                try:
                    return self._write_once(batch, fresh=False)
                except _NeedsFreshRoster:
                    return self._write_once(batch, fresh=True)
            finally:
                self._claims.release()

    def _write_once(self, batch: list[_Request], *, fresh: bool) -> list[TaskState | None]:
        attempts: list[UnitOfWork] = []

        def decide(uow: UnitOfWork) -> list[TaskState | None]:
            # A retry follows a lost save, or a decision on cached copies that the store has
            # read afresh: read the log before deciding again. Only a lost save is contention.
            again = bool(attempts)
            attempts.append(uow)
            self._claims.begin(lost_save=again and not uow.fresh, first=self.batches == 0)
            states = self._decide(batch, uow, fresh=fresh or again)
            uow.transaction = self._claims.transaction()  # its commit releases the locks
            return states

        states: list[TaskState | None] = self._store.write(ROSTER_KEY, decide, conflict_retries=self._retries)
        self.batches += 1
        return states

    def _decide(self, batch: list[_Request], uow: UnitOfWork, *, fresh: bool) -> list[TaskState | None]:
        index = self._reads.index
        roster = index.agent_profiles() if fresh else index.recent_agent_profiles(ROSTER_MAX_AGE_S)
        profiles = {p.agent_id: p for p in roster}
        now = uow.now
        if self._claims.active is not None:
            prefer = {r.task_id: r.ranking.agent_id for r in batch if r.ranking is not None}
            self._claims.lock_planned(self._claims.active, [r.task_id for r in batch], profiles, uow, prefer)
        tasks = [self._reads.task(uow, request.task_id) for request in batch]
        if not fresh and uow.from_cache and any(t.task_status is not TaskStatus.PENDING for t in tasks):
            # A cached copy saying "taken" may be one another engine moved on (released or
            # requeued the task): a batch that saves other tasks gets no version check on it,
            # so it would answer the copy and pass the task over. Read the log first, as the
            # store does for a command that saves nothing.
            raise _NeedsFreshRoster()  # the store drops this attempt's copies
        states: list[TaskState | None] = []
        for request, task in zip(batch, tasks, strict=True):
            request.refusal = None  # decided again on a retried attempt
            ranking = request.ranking  # a model's pick among tied agents (ranking.py), if asked
            usage = ranking.usage if ranking else None  # recorded however the task ends here
            if task.task_status is not TaskStatus.PENDING:
                # Asked for by name, a task no longer waiting is answered as it stands. A queue
                # run offers only tasks it read waiting, so another command took this one since
                # (another run, in this engine or another): its answer leaves it out, where it
                # counted it as its own (three runs at once each said "21 assigned" of 21 made).
                why = f"not assigned: another command left the task {task.status} during the call"
                _keep_ranking_cost(task, ranking, why)
                states.append(None if request.queue_run else task.state())
                continue
            if task.is_overdue(now):
                deadline = task.deadline.isoformat() if task.deadline else "?"
                detail = f"deadline {deadline} passed before assignment"
                self._escalate(uow, task, EscalationReason.DEADLINE_BREACHED, detail, usage)
                states.append(task.state())
                continue
            held_back = task.held_back
            # Read once, for the hold and for the reason below (``not task.required_skills``
            # first: most tasks name skills, and need no state read).
            never_classified = not task.required_skills and needs_classifying(task.state())
            if request.unclassified is not None and never_classified:
                held_back = request.unclassified
            if held_back is not None:
                if request.queue_run:
                    states.append(replace(task.state(), held_back=held_back))  # it waits; it says why
                    continue
                if ranking is None:
                    raise TaskNeedsClassification(task.task_id, held_back)
                # Refused once the batch has saved the ranking call's cost (raised here, the
                # batch's save, and the cost with it, were lost).
                _keep_ranking_cost(task, ranking, f"not assigned: the task is held back ({held_back})")
                request.refusal = TaskNeedsClassification(task.task_id, held_back)
                states.append(task.state())
                continue
            decision = self._claims.choose(task, profiles, uow, prefer=ranking.agent_id if ranking else None)
            if decision is None:
                break  # every capable agent is locked elsewhere and this batch holds some
            if isinstance(decision, Choice):
                agent = self._claims.open(uow, decision.agent_id, profiles, locked=False)
                agent.accept(task.task_id, now)
                profiles[decision.agent_id] = agent.profile()
                if ranking is not None:  # what the model said
                    decision = replace(
                        decision, reason=f"{decision.reason}; {ranking.explain(decision.agent_id)}"
                    )
                if never_classified:
                    # The library's synchronous commands route it so (docs/tasks.md); say why.
                    decision = replace(decision, reason=f"{NEVER_CLASSIFIED}: {decision.reason}")
                task.assign(decision, now, usage)
            elif not fresh:
                raise _NeedsFreshRoster()  # the store drops what this attempt changed
            elif request.escalate_when_full or decision.reason is not EscalationReason.ALL_AT_CAPACITY:
                self._escalate(uow, task, decision.reason, decision.detail, usage)
            else:
                # It waits for capacity: say why, as an escalation would (the answer said
                # nothing, so a caller could not tell a full team from a task never looked at).
                _keep_ranking_cost(
                    task, ranking, f"not assigned: the task waits for capacity ({decision.detail})"
                )
                states.append(replace(task.state(), waiting=decision.detail))
                continue
            states.append(task.state())
        return states


def _keep_ranking_cost(task: Task, ranking: Ranking | None, why: str) -> None:
    """Record a ranking call's usage on a task that no ``Assigned`` or ``Escalated`` of this
    batch carries it on: the budgets charged the call, and without an event the cost views
    never counted it (a task left waiting after the call showed $0 for a paid call)."""
    if ranking is not None and ranking.usage is not None:
        task.discard_ranking(ranking.unused(why), ranking.usage)
