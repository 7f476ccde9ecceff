"""``Engine.process_step``: a step whose model call the engine makes itself, recorded as events.

StepStarted is saved first (its own short write), carrying a lease: the worker's name
and a time until which it holds the step's idempotency key. The model is called outside
any transaction and lock while a background task renews the lease; then StepProcessed
or StepFailed is saved. Callers sharing a key share one model call: in one process
through a registry of in-flight futures; across processes by seeing the pending step
and polling for its outcome. Only when a lease lapses (its worker died) does another
caller take the step over, recording the lost attempt as ``StepFailed("worker_lost")``.

Its parts: the decisions each write makes on the session (``step_decisions.py``), the budget
hold (``step_holds.py``), the answer's recording and background saves (``step_answers.py``),
the attempts a close gives up (``step_attempts.py``) and the values they pass (``step_calls.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import uuid4

from flowledger.domain.bounds import require_flag, require_model, require_object
from flowledger.domain.errors import (
    AnswerNotSaved,
    EngineClosed,
    FlowledgerError,
    LlmError,
    LlmNotConfigured,
    SessionNotFound,
    StepInProgress,
    StepInterrupted,
)
from flowledger.domain.ports import LlmPort, LlmReply
from flowledger.domain.session_views import StepRecord
from flowledger.domain.values import JsonObject, LlmUsage, require_name
from flowledger.infrastructure.engine.budgets import BudgetService
from flowledger.infrastructure.engine.sessions import SessionService
from flowledger.infrastructure.engine.single_flight import LeaderGone, lead
from flowledger.infrastructure.engine.step_answers import StepAnswers
from flowledger.infrastructure.engine.step_attempts import Attempt, GivenUpAtStart, StepAttempts
from flowledger.infrastructure.engine.step_calls import (
    Go,
    Recorded,
    StepCall,
    StepOutcome,
    Wait,
    asked_model,
    same_request,
    usage_of,
)
from flowledger.infrastructure.engine.step_decisions import StepDecisions
from flowledger.infrastructure.engine.step_failures import waiter_error
from flowledger.infrastructure.engine.step_giving_up import record_given_up, start_step
from flowledger.infrastructure.engine.step_holds import CANCELLED, StepHolds
from flowledger.infrastructure.engine.step_leases import LeaseRenewer
from flowledger.infrastructure.engine.store import AggregateStore
from flowledger.infrastructure.postgres.budgets import Reservation

T = TypeVar("T")


class StepService:
    """Runs steps through an LLM port, with leases, takeover and in-process sharing."""

    wait_timeout_s: float = 120.0
    poll_interval_s: float = 0.02
    close_wait_s: float = 5.0
    """How long ``close`` waits, in all, for the answers still being recorded or saved before it
    gives them up (their steps are then taken over once their leases lapse, and the model called
    again). Steps whose model has not answered are not waited for: the close gives them up,
    waiting (within the same bound) only for their cancelled calls to end, to record what each used;
    its records of them take at most as long again (the database away: ``step_giving_up.py``)."""

    def __init__(
        self,
        store: AggregateStore,
        sessions: SessionService,
        llm: LlmPort | None,
        *,
        executor: ThreadPoolExecutor,
        budgets: BudgetService | None = None,
    ) -> None:
        self._store = store
        self._sessions = sessions
        self.llm = llm
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:8]}"
        # The call leading each (session, key) in this process, and the future its waiters share.
        self._inflight: dict[tuple[str, str], tuple[StepCall, asyncio.Future[StepOutcome]]] = {}
        self.executor = executor
        """The threads database work runs on (blocking, psycopg): shared by the engines of one store."""
        # The attempts begun and not yet settled: the close gives up those still calling their model.
        self._attempts = StepAttempts()
        self._decide = StepDecisions(store, sessions, self.worker)
        self._holds = StepHolds(budgets, sessions, self.worker, self._db_future, self._record_failure)
        self._answers = StepAnswers(
            store,
            self._decide,
            self._holds,
            self._db_future,
            self._record_failure,
            self._renewer,
            self._as_recorded,
            self._attempts.opening,
        )

    @property
    def save_retry_s(self) -> float:
        """How long a worker keeps trying to save a paid answer the store would not take
        (``StepAnswers.save_retry_s``, 120 s)."""
        return self._answers.save_retry_s

    @save_retry_s.setter
    def save_retry_s(self, seconds: float) -> None:
        self._answers.save_retry_s = seconds

    @property
    def budgets(self) -> BudgetService | None:
        """The budgets a step's call is held and charged in (None: none)."""
        return self._holds.budgets

    @property
    def lease(self) -> timedelta:
        """How long a started step's worker holds its key without renewing."""
        return self._decide.lease

    async def process(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        *,
        merge_input: bool = False,
        user_id: str | None = None,
    ) -> StepRecord:
        """Call the model for one step and record the outcome; a known key returns its record.

        With ``merge_input``, the input's keys are merged into the session context before the
        model is called (ContextUpdated, in the same write as StepStarted), as the seed's
        webhook did; the model's ``context_update`` is merged after, as always.

        Raises an LlmError (after recording StepFailed) when the call fails, and
        StepInProgress when a live worker holds the key past ``wait_timeout_s``. With ``user_id``,
        SessionOwnedByAnother when the session has another user (nothing recorded).
        """
        outcome = await self.run(
            session_id, step, input, model, idempotency_key, merge_input=merge_input, user_id=user_id
        )
        return outcome.record

    async def run(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        *,
        merge_input: bool = False,
        user_id: str | None = None,
    ) -> StepOutcome:
        """``process``, answering with the session's context after the step as well.

        A model the adapter cannot price (``check_model``) is refused before anything is
        recorded: no StepStarted, no StepFailed.
        """
        try:
            llm, call = self._call_of(session_id, step, input, model, idempotency_key, merge_input, user_id)
        except FlowledgerError:
            if user_id is not None:  # told first, as when the edges checked it before the step
                await self._in_db(self._sessions.ensure_owner, session_id, user_id)
            raise
        loop = asyncio.get_running_loop()
        slot = (session_id, call.key)
        while (inflight := self._inflight.get(slot)) is not None and inflight[1].get_loop() is loop:
            leading, running = inflight
            if not same_request(leading, call):
                # Another request under the key shares nothing, and is not what decides it: the
                # store says which request the key names once the one in flight here has begun
                # or been refused. Refused here at once, a request the key named (held by
                # another process) was told "another input" when the one ahead was refused.
                await asyncio.wait([running])
                continue
            try:
                return await asyncio.shield(running)
            except LeaderGone:
                continue
        return await lead(self._inflight, slot, call, partial(self._run, llm, call))

    def _call_of(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None,
        model: str | None,
        idempotency_key: str | None,
        merge_input: bool,
        user_id: str | None,
    ) -> tuple[LlmPort, StepCall]:
        """The adapter and the call ``run`` makes, checked (nothing is loaded or recorded)."""
        self._store.app.ensure_open("process a step")  # before "no model": closed says more
        llm = self.llm
        if llm is None:
            raise LlmNotConfigured()
        require_name("session_id", session_id)
        require_name("step", step)
        payload = input if input is not None else {}
        require_object("input", payload)  # the prompt merges it into the context
        if model is not None:
            require_model(model)  # before the price table strips it
        require_flag("merge_input", merge_input)
        check_model = getattr(llm, "check_model", None)
        if check_model is not None:
            check_model(model)
        # Only None makes a fresh key: a falsy key (0, "", []) is refused like any other non-name.
        key = (
            f"step-{uuid4().hex}"
            if idempotency_key is None
            else require_name("idempotency_key", idempotency_key)
        )
        asked = asked_model(llm, model)
        return llm, StepCall(session_id, step, payload, model, key, merge_input, asked, user_id=user_id)

    async def aclose(self) -> None:
        """Give up the steps in flight and finish the answers (``close``), then close the LLM
        adapter (when it has ``aclose``) and the worker threads."""
        await asyncio.to_thread(self._stop)
        closer = getattr(self.llm, "aclose", None)
        if closer is not None:
            await closer()
        # Waiting for the worker threads blocks: do it off the event loop.
        await asyncio.to_thread(self.executor.shutdown, True)

    def close(self, *, executor: bool = True) -> None:
        """Give up the steps whose model has not answered (``_stop``), wait up to ``close_wait_s``
        for the answers still being recorded or saved, give up the rest (their threads ended) and,
        unless ``executor`` is False (the threads belong to another engine of the store,
        ``Engine.for_tenant``), shut the worker threads down (without waiting)."""
        self._stop()
        if executor:
            self.executor.shutdown(wait=False)

    def _stop(self) -> None:
        """Before the store closes: cancel the model calls of the attempts in flight and record
        each as failed (``engine_closed``) with its budget hold settled, so that a retry of its
        key elsewhere runs at once (with what each used when its call was paid for all the same,
        ``step_attempts.py``: waited for; the records within ``close_wait_s`` of their own,
        ``step_giving_up.py``); then wait, within ``close_wait_s`` in all, for the answers being
        recorded and the answers being saved."""
        deadline = time.monotonic() + self.close_wait_s
        given_up = self._attempts.give_up()
        self._attempts.wait_calls_ended(given_up, deadline)  # paid as cancelled: what they used
        record_given_up(given_up, self._attempts, self._store, self._decide, self.budgets, self.close_wait_s)
        self._attempts.wait_answered(deadline)
        self._answers.savers.close(max(0.0, deadline - time.monotonic()))

    async def _run(self, llm: LlmPort, call: StepCall) -> StepOutcome:
        loop, thread = asyncio.get_running_loop(), threading.get_ident()
        while True:
            begun = await self._begin_surely(call, loop, thread)
            if isinstance(begun, Recorded):
                return await self._as_recorded(call, begun)
            if isinstance(begun, Attempt):
                return await self._call_and_record(llm, call, begun.go, begun)
            if isinstance(begun, GivenUpAtStart):
                raise StepInterrupted(call.session_id, call.key, given_up=begun.recorded)
            outcome = await self._await_outcome(call)
            if outcome is not None:
                return outcome
            # The key is no longer held by a live worker: decide afresh.

    async def _begin_surely(
        self, call: StepCall, loop: asyncio.AbstractEventLoop, thread: int
    ) -> Recorded | Attempt | GivenUpAtStart | Wait:
        """Write StepStarted and register the attempt (``step_giving_up.start_step``); if the
        caller is cancelled meanwhile, still close what was begun."""
        # The executor's future itself is shielded (no task around it): the write runs to
        # its end on its thread whatever happens to the caller.
        saved = self._db_future(start_step, self._store, self._decide, self._attempts, call, loop, thread)
        try:
            return await asyncio.shield(saved)
        except asyncio.CancelledError:
            begun = await saved
            if isinstance(begun, Attempt):
                self._attempts.end(begun)
                await self._record_failure(call, begun.go, "cancelled", "the caller cancelled the step", None)
            raise

    async def _call_and_record(self, llm: LlmPort, call: StepCall, go: Go, attempt: Attempt) -> StepOutcome:
        try:
            return await self._attempt(llm, call, go, attempt)
        except EngineClosed as error:
            # Closed after StepStarted was saved (before the hold, or while a failure was
            # recorded): a bare EngineClosed named no key, and the caller that gave none could
            # not retry the step it had begun.
            if isinstance(error, StepInterrupted):
                raise
            given_up = self._attempts.given_up(attempt) and await self._told(attempt, None)
            raise StepInterrupted(call.session_id, call.key, given_up=given_up) from error
        finally:
            self._attempts.end(attempt)

    async def _attempt(self, llm: LlmPort, call: StepCall, go: Go, attempt: Attempt) -> StepOutcome:
        hold = await self._holds.reserve(llm, call, go)
        if not self._attempts.held(attempt, hold):  # given up by the close: the model not called
            with contextlib.suppress(Exception):
                await self._holds.settle(hold, None)
            raise StepInterrupted(call.session_id, call.key, given_up=await self._told(attempt, None))
        reply = await self._call(llm, call, go, hold, attempt)  # a failure is recorded and settled there
        if not self._attempts.answered(attempt):
            # Answered after the close gave the step up: what it used goes on its engine_closed.
            raise AnswerNotSaved(call.session_id, call.key, given_up=await self._told(attempt, reply.usage))
        # The model answered and was paid for: its settlement and StepProcessed are written
        # whatever happens to the caller now. Cancelled between the two, the step stayed
        # pending with its cost in the ledger and in no event, and a retry paid again.
        recording = asyncio.ensure_future(self._answers.record(call, go, reply, hold))
        try:
            return await asyncio.shield(recording)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await recording
            raise

    def _told(self, attempt: Attempt, usage: object) -> Awaitable[bool]:
        """Whether the close recorded the attempt it gave up (``StepAttempts.told_given_up``),
        waited for within the close's two bounds (its waits, its records) and a second."""
        return self._attempts.told_given_up(attempt, usage, 2 * self.close_wait_s + 1.0)

    async def _as_recorded(self, call: StepCall, found: Recorded) -> StepOutcome:
        """A recorded step as its first caller got it: with the context right after it, read at
        its version when the session has moved on since (a bounded state holds no earlier one),
        so a replayed key answers the same and not the context later steps made."""
        if found.version == found.record.version:
            return StepOutcome(found.record, found.context)
        try:
            state = await self._in_db(self._sessions.get, call.session_id, found.record.version)
        except SessionNotFound:
            # Retention archived the events (docs/retention.md): the context at that version is
            # in the bundle only. Answer as before rather than call an existing session unknown.
            return StepOutcome(found.record, found.context)
        return StepOutcome(found.record, state.context)

    async def _call(
        self, llm: LlmPort, call: StepCall, go: Go, hold: Reservation | None, attempt: Attempt
    ) -> LlmReply:
        """The model call itself; a failure is recorded as StepFailed and its hold settled (at
        what it reported it used) before it is raised. A call the engine's close cancelled (or
        that ended after the close gave it up) is StepInterrupted: the close records it."""
        renewer = self._renewer(call, go)
        # A task of its own, so that the close can cancel the call and not the caller.
        model_call = asyncio.ensure_future(
            llm.complete(model=call.model, messages=go.messages, json_mode=True)
        )
        self._attempts.calling(attempt, model_call)
        try:
            try:
                return await model_call
            except BaseException as error:
                task = asyncio.current_task()
                if self._attempts.given_up(attempt) and (task is None or not task.cancelling()):
                    given_up = await self._told(attempt, usage_of(error))
                    raise StepInterrupted(call.session_id, call.key, given_up=given_up) from error
                raise
            finally:
                renewer.stop()
        except StepInterrupted:
            raise
        except LlmError as error:
            await self._fail_and_settle(call, go, hold, error.error_type, error, error.usage, error.usage)
            raise
        except asyncio.CancelledError as error:
            usage = usage_of(error)  # a cancelled call may carry it
            await asyncio.shield(self._fail_and_settle(call, go, hold, "cancelled", CANCELLED, usage, usage))
            raise
        except Exception as error:
            await self._fail_and_settle(call, go, hold, type(error).__name__, error, None, usage_of(error))
            raise

    async def _fail_and_settle(
        self,
        call: StepCall,
        go: Go,
        hold: Reservation | None,
        error_type: str,
        error: BaseException | str,
        usage: LlmUsage | None,
        billed: LlmUsage | None,
    ) -> None:
        """Record the failed attempt (with ``usage``), then settle its hold at what it was
        ``billed``, both at one moment: the budgets count the call in the day (month) the
        dashboard does, its event's. The hold is settled even when the failure cannot be
        recorded."""
        at = self._store.clock()
        try:
            await self._record_failure(call, go, error_type, error, usage, now=at)
        finally:
            await self._holds.settle(hold, billed, at=at)

    async def _record_failure(
        self,
        call: StepCall,
        go: Go,
        error_type: str,
        error: BaseException | str,
        usage: LlmUsage | None,
        *,
        now: datetime | None = None,
    ) -> None:
        """Record the attempt as failed with ``error``'s message and fields (a string: a message
        with no fields), so that a caller waiting on its key is given the same error; stamped
        ``now`` when given (the moment its hold is settled at)."""
        await self._in_db(
            partial(self._store.write, now=now),
            call.session_id,
            partial(self._decide.fail, call, go, error_type, error, usage),
        )

    async def _await_outcome(self, call: StepCall) -> StepOutcome | None:
        """Poll while a live worker holds the key; None once it does not (decide afresh).

        A failure recorded under the key is raised as the error its caller got, unless it
        said nothing of the request (``step_failures.waiter_error``): then None as well.
        EngineClosed at the first poll after this engine's close began.
        """
        deadline = time.monotonic() + self.wait_timeout_s
        interval = self.poll_interval_s
        while True:
            if self._attempts.closing:  # (a tenant's engine polled on, its store open, until the deadline)
                raise EngineClosed("process a step")
            state = await self._in_db(self._sessions.get, call.session_id)
            for record in reversed(state.history):
                if record.idempotency_key == call.key:
                    return await self._as_recorded(call, Recorded(record, state.version, state.context))
            pending = next((p for p in state.pending if p.idempotency_key == call.key), None)
            if pending is None:
                failure = next((f for f in reversed(state.failures) if f.idempotency_key == call.key), None)
                error = None if failure is None else waiter_error(failure, state, self._store.clock())
                if error is None:
                    return None  # nothing recorded about the request: run it (decide afresh)
                raise error
            if self._store.clock() >= pending.lease_until:
                return None
            if time.monotonic() >= deadline:
                raise StepInProgress(call.session_id, call.key, self.wait_timeout_s)
            await asyncio.sleep(interval)
            interval = min(interval * 2, 1.0)

    def _db_future(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``function(*args)`` on a database thread (one hop), as a future of this loop.

        Run in a copy of the caller's context (``run_in_executor`` does not copy it, unlike
        ``asyncio.to_thread``), so ``Engine.acting_as`` reaches the events the step writes.
        EngineClosed once ``close`` shut the threads down (the only reason the executor refuses
        work): a step whose model answered meanwhile told its caller ``LlmError: ... could not
        be recorded: RuntimeError: cannot schedule new futures after shutdown``.
        """
        context = contextvars.copy_context()
        try:
            return asyncio.get_running_loop().run_in_executor(
                self.executor, partial(context.run, function, *args)
            )
        except RuntimeError:
            raise EngineClosed("process a step") from None

    async def _in_db(self, function: Callable[..., T], *args: Any) -> T:
        return await self._db_future(function, *args)

    def _renewer(self, call: StepCall, go: Go, *, first_in: float | None = None) -> LeaseRenewer:
        """Renewals of this attempt's lease (each a write on a database thread) until stopped."""

        # Run in a copy of the caller's context, as ``_db_future`` runs its work.
        context = contextvars.copy_context()

        def renewal() -> bool:
            renew = partial(self._store.write, call.session_id, partial(self._decide.renew, call, go))
            return context.copy().run(renew)

        return LeaseRenewer(
            renewal, self.executor.submit, self._store.settings.step_lease_s, first_in=first_in
        )
