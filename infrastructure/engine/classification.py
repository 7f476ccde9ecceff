"""Classifying tasks: through the LLM port (its usage kept on the event), or as the caller says.

The model is the task's priority tier (``ModelTiers``, the latency-target policy choosing
within a tier) unless the caller names one; a named model the adapter cannot price is
refused before anything is recorded. The call happens outside any lock or transaction;
only its outcome is written. A call that fails, or whose reply is not a classification,
is recorded as ``ClassificationFailed`` (with whatever usage it reported) and retried once
on the routing's fallback model; if that fails too the task keeps waiting, unclassified,
for a ``reclassify``. A classification derives, through the skill catalogue, the skills,
priority and deadline the creator left out, recorded with their reasons.

Budgets hold each call, the fallback's included, as they hold a step's (``task_budgets.py``,
docs/budgets.md "Task calls"): a call an enforced budget cannot take is not made and
``BudgetExceeded`` is raised with nothing recorded; a refused primary does not try the
fallback (a refusal is not a failure). A fallback refused after the primary failed leaves the
primary's ``ClassificationFailed`` naming no fallback, its detail saying why, and raises. A
primary call the endpoint's open circuit refused before sending anything is no failure either:
``CircuitOpen`` is raised with nothing recorded and the task is not held back.

Concurrent classifications of one task in one engine share one call (single flight, as
steps do): the first caller leads, and a later ``classify`` waits for its outcome and gets
the same answer (or error); a later ``reclassify`` shares only another ``reclassify`` on the
same model, and otherwise makes its own call once the first has ended. A cancelled leader
hands over to the first waiter. Across engines (PostgreSQL), a classify about to call the
model holds the task's lock (``TaskLocks``) through the call and the save; one that waited
for it, or found a classification recorded since it read the task when it took it, reads the
task again and, finding it classified, makes no call. A reclassify holds a
lock of the task's for its model (``ClassifyRequest.purpose``), so only a reclassify on the same
model waits for it; one that waited and finds a classification (or its failure) recorded
since it read the task takes that as its answer, as it would in one engine. The lock is only
an optimisation: waiting for it is bounded (``lock_wait_s``, the setting
``FLOWLEDGER_CLASSIFY_LOCK_WAIT_S``), and without it (memory, PgBouncer, the database not
answering) a classify calls anyway, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any
from uuid import UUID

from flowledger.domain.aggregate import command_id_of
from flowledger.domain.bounds import require_model, require_name
from flowledger.domain.errors import (
    CircuitOpen,
    LlmError,
    LlmNotConfigured,
    TaskNotFound,
    TaskTransitionRejected,
    ValidationError,
)
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.ports import LlmPort
from flowledger.domain.pricing import PriceTable
from flowledger.domain.prompts import classification_messages
from flowledger.domain.routing import observed_latencies
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task import Task
from flowledger.domain.task_transitions import whereabouts
from flowledger.domain.task_views import Classification, TaskPriority, TaskState
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.classification_requests import CallCommand, ClassifyRequest
from flowledger.infrastructure.engine.single_flight import LeaderGone, lead
from flowledger.infrastructure.engine.step_calls import usage_of
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_budgets import TaskCallBudgets
from flowledger.infrastructure.engine.task_lock_waits import TaskLocks, let_go, take_lock
from flowledger.infrastructure.engine.task_reads import TaskReads, task_key
from flowledger.infrastructure.postgres.budgets import Reservation

_TYPICAL_CALL = {"input_tokens": 300, "output_tokens": 60}
"""The size of a classification call, for comparing models' costs (prompt ~300, reply ~60 tokens)."""


def refused_unsent(error: Exception) -> bool:
    """Whether the call was refused before any request went out by the endpoint's open circuit:
    not a failed classification (nothing was asked), so, as a budget's refusal, it is raised with
    nothing recorded. Recorded, it held the task back until reclassified by hand: a queue run into
    an open circuit held back every task after the breaker opened and answered 200."""
    return isinstance(error, CircuitOpen) and error.attempts == 0


class TaskClassifier:
    """Classifies one tenant's tasks, by a model through the LLM port or as the caller says."""

    lock_poll_s: float = 0.05
    """How often a waiting classify asks for the lock again."""

    def __init__(
        self,
        store: AggregateStore,
        reads: TaskReads,
        llm: LlmPort | None,
        *,
        catalogue: SkillCatalogue,
        tiers: ModelTiers,
        locks: TaskLocks | None = None,
        lock_wait_s: float = 60.0,
        budgets: TaskCallBudgets | None = None,
    ) -> None:
        self._store = store
        self.budgets = budgets if budgets is not None else TaskCallBudgets(None)
        """The budgets each model call of a task is held in and settled against."""
        self.locks = locks
        self.lock_wait_s = lock_wait_s
        """How long a classify waits for another engine's classification of the task to end
        before it calls the model anyway (``Settings.classify_lock_wait_s``)."""
        self._reads = reads
        self.llm = llm
        self.catalogue = catalogue
        self.tiers = tiers
        self._observed: deque[LlmUsage] = deque(maxlen=2000)
        # The call classifying each task in this process, and the future its waiters share.
        self._inflight: dict[str, tuple[ClassifyRequest, asyncio.Future[TaskState]]] = {}

    def record(self, task_id: str, category: str, complexity: str, estimated_hours: float) -> TaskState:
        """Record a classification made elsewhere (no model usage). The first one recorded
        stands: a task already classified is returned unchanged."""
        return self.record_telling(task_id, category, complexity, estimated_hours)[0]

    def record_telling(
        self, task_id: str, category: str, complexity: str, estimated_hours: float
    ) -> tuple[TaskState, bool]:
        """``record``, and whether this call recorded the classification sent (False: the task
        was classified before, or is closed). Told by the write that decided, so of two callers
        at once only the one whose classification stands is told it recorded it."""
        classification = Classification(
            category=category, complexity=complexity, estimated_hours=estimated_hours
        )
        took = [False]
        state = self._write(task_id, partial(self._record, task_id, classification, took))
        return state, took[0]

    def _record(
        self, task_id: str, classification: Classification, took: list[bool], uow: UnitOfWork
    ) -> TaskState:
        # Set on every run of the decision: a save retried after a conflict decides again.
        task = self._reads.task(uow, task_id)
        took[0] = task.classification is None and not task.task_status.is_final
        return self._classify(task_id, classification, None, False, uow)

    async def classify(
        self, task_id: str, model: str | None = None, *, idempotency_key: str | None = None
    ) -> TaskState:
        """Ask the model what the task is and record it with the call's usage.

        A task already classified, completed or escalated is returned unchanged (no call).
        ``idempotency_key``: a retry with it after the call was answered (a task whose every
        call failed, say) makes no second call (``CallCommand``).
        """
        return await self._run(task_id, model, again=False, key=idempotency_key)

    async def reclassify(
        self, task_id: str, model: str | None = None, *, idempotency_key: str | None = None
    ) -> TaskState:
        """Classify again, replacing the classification (TaskTransitionRejected once closed);
        with ``idempotency_key``, a retry after the call was answered makes no second call."""
        return await self._run(task_id, model, again=True, key=idempotency_key)

    def route(self, priority: TaskPriority) -> tuple[str, str]:
        """The model a task of ``priority`` is classified on, and why."""
        prices = getattr(self.llm, "prices", None)
        costs = (
            {m: prices.estimate(m, **_TYPICAL_CALL) for m in self.tiers.models() if prices.knows(m)}
            if isinstance(prices, PriceTable)
            else {}
        )
        policy = self.tiers.policy(costs)  # a model without a price comes after the priced ones
        chosen = policy.choose(observed_latencies(list(self._observed)), priority.value)
        tier = ", ".join(self.tiers.tiers[priority.value])
        return (
            chosen.model,
            f"{priority.value} tier [{tier}] (routing {self.tiers.version}): {chosen.reason.value}",
        )

    async def _run(self, task_id: str, model: str | None, *, again: bool, key: str | None) -> TaskState:
        self._reads.task_uuid(task_id)  # checked before it keys the single-flight table
        if model is not None:
            require_model(model)
        if key is not None:
            require_name("idempotency_key", key)
        llm = self.llm
        if llm is None:
            raise LlmNotConfigured()
        check_model = getattr(llm, "check_model", None)
        if model is not None and check_model is not None:
            check_model(model)  # UnknownModelPrice: refused before anything is recorded
        request = ClassifyRequest(model, again, key)
        loop = asyncio.get_running_loop()
        while (inflight := self._inflight.get(task_id)) is not None and inflight[1].get_loop() is loop:
            leading, running = inflight
            try:
                state = await asyncio.shield(running)
            except LeaderGone:
                continue  # its caller was cancelled: the first waiter to wake leads
            except Exception:
                if request.shares(leading, answered=False):
                    raise
                continue
            if request.shares(leading, answered=True):
                return state
        return await lead(self._inflight, task_id, request, partial(self._lead, llm, task_id, request))

    async def _lead(self, llm: LlmPort, task_id: str, request: ClassifyRequest) -> TaskState:
        model, again = request.model, request.again
        command = CallCommand.of(request)
        found = await self._load(task_id, again=again, command=command)
        if isinstance(found, TaskState):
            return found
        locks = self.locks
        if locks is None:
            return await self._call(llm, found, model, again=again, command=command)
        # Across processes: one classify (or reclassify on one model) at a time per task; one
        # that waited reads the task again, which the other has classified by then (module
        # docstring). So does a classify that found the lock free but a classification
        # recorded since its first read: another's whole call and save fitted between the two.
        # (A reclassify that did not wait makes its call: the one recorded may be on another
        # model, which it does not share.)
        key, purpose, seen = found.id, request.purpose, found.version
        taken, waited = await take_lock(locks, key, purpose, wait_s=self.lock_wait_s, poll_s=self.lock_poll_s)
        try:
            if waited or (not again and await self._classified_since(key, seen)):
                found = await self._load(task_id, again=again, command=command)
                if isinstance(found, TaskState):
                    return found
                if again and await self._classified_since(key, seen):
                    return found.state()
            return await self._call(llm, found, model, again=again, command=command)
        finally:
            if taken:
                await let_go(locks, key, purpose)

    async def _load(self, task_id: str, *, again: bool, command: CallCommand | None) -> Task | TaskState:
        """The task to classify, or its state when there is nothing to do (already classified,
        or closed: TaskTransitionRejected for a reclassify; the caller's key already answered:
        TaskIdempotencyKeyReused when it named another request)."""
        task: Task | None = await asyncio.to_thread(self._store.load, self._reads.task_uuid(task_id))
        if task is None:
            raise TaskNotFound(task_id)
        if command is not None:
            events = await asyncio.to_thread(self._store.events, task.id)
            if command.answered(task_id, [command_id_of(event) for event in events]):
                return task.state()
        if task.task_status.is_final:
            if again:  # said as a release or requeue says it: where the task stands, and by whom
                where = whereabouts(task.task_status, task.assignment, task.times_assigned)
                raise TaskTransitionRejected(task_id, task.status, "reclassify", where=where)
            return task.state()
        if task.classification is not None and not again:
            return task.state()
        return task

    async def _classified_since(self, task: UUID, version: int) -> bool:
        """Whether a classification, or a failed one, was recorded on the task after ``version``
        (by the reclassify on the same model this one waited for)."""
        events = await asyncio.to_thread(self._store.events, task, gt=version)
        return any(isinstance(event, Task.Classified | Task.ClassificationFailed) for event in events)

    async def _call(
        self, llm: LlmPort, task: Task, model: str | None, *, again: bool, command: CallCommand | None
    ) -> TaskState:
        task_id = task.task_id
        since = task.version
        if model is not None:
            chosen, route = model, "named by the caller"
        else:
            chosen, route = self.route(TaskPriority(task.priority))
        messages = classification_messages(task)
        # Refused by a budget: BudgetExceeded, nothing recorded, and the fallback is not tried
        # (it stands in for a model that failed, not for one the budgets stopped).
        hold = await self.budgets.hold(llm, chosen, messages)
        attempt: str | None = chosen
        state = task.state()
        while attempt is not None:
            usage: LlmUsage | None = None
            try:
                reply = await self.budgets.complete(llm, attempt, messages, hold)
                usage = reply.usage
                self._observed.append(reply.usage)
                classification = Classification.from_reply(reply.content, reply.usage)
            except (LlmError, ValidationError) as error:
                if attempt == chosen and refused_unsent(error):
                    raise
                if isinstance(error, LlmError):
                    usage = error.usage
                detail = f"{type(error).__name__}: {error}"
            except asyncio.CancelledError as error:
                paid = usage_of(error)  # charged to the budgets: kept for its cost, as a step's is
                if paid is not None:
                    decide = partial(
                        self._discarded, task_id, f"cancelled during the call to {attempt}", paid
                    )
                    await _save_through_cancel(
                        self._writer(task_id, command, attempt == chosen, since), decide
                    )
                raise
            else:
                decide = partial(self._classify, task_id, classification, route, again)
                write = self._writer(task_id, command, attempt == chosen, since)
                return await asyncio.to_thread(write, decide)
            fallback = self.tiers.fallback_for(attempt) if attempt == chosen else None
            try:
                hold, refused = await self._hold_fallback(llm, fallback, messages)
            except asyncio.CancelledError:
                # The failed call was paid: its failure is recorded all the same.
                detail = f"{detail}; cancelled before fallback {fallback} was tried"
                decide = partial(self._failed, task_id, attempt, detail, usage, None)
                await _save_through_cancel(self._writer(task_id, command, attempt == chosen, since), decide)
                raise
            if refused is not None:
                detail = f"{detail}; fallback {fallback} not tried: {refused}"
                fallback = None
            decide = partial(self._failed, task_id, attempt, detail, usage, fallback)
            try:
                state = await asyncio.to_thread(
                    self._writer(task_id, command, attempt == chosen, since), decide
                )
            except BaseException:
                await self.budgets.settle(hold, None)
                raise
            if state.status.is_final:
                await self.budgets.settle(hold, None)
                return state
            if refused is not None:
                raise refused
            route = f"{route}; retried on fallback {fallback} after {attempt} failed"
            attempt = fallback
        return state

    async def _hold_fallback(
        self, llm: LlmPort, fallback: str | None, messages: list[dict[str, Any]]
    ) -> tuple[Reservation | None, Exception | None]:
        """The budgets' hold for the fallback's call, taken before the failure that calls for it
        is recorded (which names the fallback only if it will be tried): (hold, None), or
        (None, why) when the budgets refuse it (or the ledger cannot be asked, or the cost
        not estimated): raised once the failure is recorded."""
        if fallback is None:
            return None, None
        try:
            return await self.budgets.hold(llm, fallback, messages), None
        except Exception as error:
            return None, error

    def _write(self, task_id: str, decide: partial[TaskState]) -> TaskState:
        state: TaskState = self._store.write(task_key(task_id), decide)
        self._reads.note(state)
        return state

    def _writer(
        self, task_id: str, command: CallCommand | None, primary: bool, since: int
    ) -> Callable[[partial[TaskState]], TaskState]:
        """How one outcome of a call is saved: as any write without the caller's key; with it,
        under the command id of that outcome (the primary's or the fallback's), and once only:
        a save retried after its commit was lost finds its id in the log and writes nothing
        again (the store decides again, rather than answering, for a caller's id)."""
        if command is None:
            return partial(self._write, task_id)
        command_id = command.id(primary=primary)
        task = self._reads.task_uuid(task_id)

        def write(decide: partial[TaskState]) -> TaskState:
            def once(uow: UnitOfWork) -> TaskState:
                stored = self._store.events(task, gt=since)
                if any(command_id_of(event) == command_id for event in stored):
                    return self._reads.task(uow, task_id).state()
                return decide(uow)

            state: TaskState = self._store.write(task_key(task_id), once, command_id=command_id)
            self._reads.note(state)
            return state

        return write

    def _classify(
        self, task_id: str, classification: Classification, route: str | None, again: bool, uow: UnitOfWork
    ) -> TaskState:
        task = self._reads.task(uow, task_id)
        if (task.classification is None or again) and not task.task_status.is_final:
            task.classify(
                classification,
                task.derive_routing(self.catalogue, classification, uow.now),
                route,
                again=again,
            )
        elif classification.usage is not None:
            # Someone else classified or closed it during the call: keep what the call cost.
            why = (
                f"task already {task.task_status.value}"
                if task.task_status.is_final
                else "task already classified (by another call while this one ran)"
            )
            task.discard_classification(why, classification.usage)
        return task.state()

    def _discarded(self, task_id: str, reason: str, usage: LlmUsage, uow: UnitOfWork) -> TaskState:
        task = self._reads.task(uow, task_id)
        task.discard_classification(reason, usage)
        return task.state()

    def _failed(
        self,
        task_id: str,
        model: str,
        detail: str,
        usage: LlmUsage | None,
        fallback: str | None,
        uow: UnitOfWork,
    ) -> TaskState:
        task = self._reads.task(uow, task_id)
        # Closed during the call: the failure is kept (and what it cost), no fallback is tried.
        next_try = None if task.task_status.is_final else fallback
        task.classification_failed(model, detail, usage, next_try, uow.now)
        return task.state()


async def _save_through_cancel(
    write: Callable[[partial[TaskState]], TaskState], decide: partial[TaskState]
) -> None:
    """Save what a paid call's caller, cancelled, leaves to record (shielded; errors dropped)."""
    with contextlib.suppress(Exception):
        await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(write, decide)))
