"""``Engine.process_step``: a step whose model call the engine makes itself, recorded as events.

StepStarted is saved first (its own short write), carrying a lease: the worker's name
and a time until which it holds the step's idempotency key. The model is called outside
any transaction and lock while a background task renews the lease; then StepProcessed
or StepFailed is saved. Callers sharing a key share one model call: in one process
through a registry of in-flight futures; across processes by seeing the pending step
and polling for its outcome. Only when a lease lapses (its worker died) does another
caller take the step over, recording the lost attempt as ``StepFailed("worker_lost")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar
from uuid import UUID, uuid4

from flowledger.domain.bounds import require_flag, require_model, require_object, storable, storable_name
from flowledger.domain.budget import CallScope
from flowledger.domain.errors import (
    AnswerNotSaved,
    BudgetExceeded,
    ConcurrentUpdate,
    EngineClosed,
    FlowledgerError,
    LlmError,
    LlmNotConfigured,
    SessionClosed,
    SessionNotFound,
    StepInProgress,
    StepInterrupted,
    StoreUnavailable,
    ValidationError,
)
from flowledger.domain.ports import LlmPort, LlmReply, parse_step_reply, step_messages
from flowledger.domain.session import Session
from flowledger.domain.session_leases import ENGINE_CLOSED, lapsed_others
from flowledger.domain.session_rules import require_owner
from flowledger.domain.session_views import SessionStatus, StepRecord
from flowledger.domain.storable_usage import storable_usage
from flowledger.domain.values import JsonObject, LlmUsage, require_name
from flowledger.infrastructure.engine.answer_savers import AnswerSavers, being_saved, not_kept
from flowledger.infrastructure.engine.budgets import BudgetService, call_cost, held_estimate, step_hold_id
from flowledger.infrastructure.engine.merged_input import require_same_merge
from flowledger.infrastructure.engine.sessions import SessionService
from flowledger.infrastructure.engine.single_flight import LeaderGone, lead
from flowledger.infrastructure.engine.step_attempts import Attempt, StepAttempts
from flowledger.infrastructure.engine.step_calls import (
    Go,
    Recorded,
    StepCall,
    StepOutcome,
    Unrecordable,
    Wait,
    asked_model,
    changed_keys,
    same_request,
    usage_of,
)
from flowledger.infrastructure.engine.step_failures import failure_detail, unrecorded_answer, waiter_error
from flowledger.infrastructure.engine.step_leases import LeaseRenewer
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.postgres.budgets import Reservation

T = TypeVar("T")
_CANCELLED = "the caller cancelled the step"


class StepService:
    """Runs steps through an LLM port, with leases, takeover and in-process sharing."""

    wait_timeout_s: float = 120.0
    poll_interval_s: float = 0.02
    save_retry_s: float = 120.0
    """How long a worker keeps trying to save a paid answer the store would not take. Below the
    budgets' RESERVATION_TTL_S (600 s): a settlement tried again counts only a hold still held."""
    close_wait_s: float = 5.0
    """How long ``close`` waits, in all, for the answers still being recorded or saved before it
    gives them up (their steps are then taken over once their leases lapse, and the model called
    again). Steps whose model has not answered are not waited for: the close gives them up."""

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
        self.budgets = budgets
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:8]}"
        # The call leading each (session, key) in this process, and the future its waiters share.
        self._inflight: dict[tuple[str, str], tuple[StepCall, asyncio.Future[StepOutcome]]] = {}
        self.executor = executor
        """The threads database work runs on (blocking, psycopg): shared by the engines of one store."""
        # Answers still being saved after their caller was told the store is unavailable: each
        # on a thread of its own, with its own event loop (``_save_later``).
        self._savers = AnswerSavers()
        # The attempts begun and not yet settled: the close gives up those still calling their model.
        self._attempts = StepAttempts()

    @property
    def lease(self) -> timedelta:
        """How long a started step's worker holds its key without renewing."""
        return timedelta(seconds=self._store.settings.step_lease_s)

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
        each as failed (``engine_closed``, no usage: the model never answered) with its budget
        hold released, so that a retry of its key elsewhere runs at once; then wait, within
        ``close_wait_s`` in all, for the answers being recorded and the answers being saved."""
        deadline = time.monotonic() + self.close_wait_s
        for attempt in self._attempts.give_up():
            with contextlib.suppress(Exception):  # the store away: the lease lapses, as before
                self._store.write(attempt.call.session_id, partial(self._fail_given_up, attempt))
            if attempt.hold is not None and self.budgets is not None:
                with contextlib.suppress(Exception):
                    self.budgets.notify(self.budgets.settle(attempt.hold, Decimal(0), held_only=True))
        self._attempts.wait_answered(deadline)
        self._savers.close(max(0.0, deadline - time.monotonic()))

    def _fail_given_up(self, attempt: Attempt, uow: UnitOfWork) -> None:
        message = f"the engine closed before the model answered (worker {self.worker})"
        self._fail(attempt.call, attempt.go, ENGINE_CLOSED, message, None, uow)

    async def _run(self, llm: LlmPort, call: StepCall) -> StepOutcome:
        while True:
            begun = await self._begin_surely(call)
            if isinstance(begun, Recorded):
                return await self._as_recorded(call, begun)
            if isinstance(begun, Go):
                return await self._call_and_record(llm, call, begun)
            outcome = await self._await_outcome(call)
            if outcome is not None:
                return outcome
            # The key is no longer held by a live worker: decide afresh.

    async def _begin_surely(self, call: StepCall) -> Recorded | Go | Wait:
        """Write StepStarted; if the caller is cancelled meanwhile, still close what was begun."""
        # The executor's future itself is shielded (no task around it): the write runs to
        # its end on its thread whatever happens to the caller.
        saved = self._db_future(self._store.write, call.session_id, partial(self._begin, call))
        try:
            return await asyncio.shield(saved)
        except asyncio.CancelledError:
            begun = await saved
            if isinstance(begun, Go):
                await self._record_failure(call, begun, "cancelled", "the caller cancelled the step", None)
            raise

    def _begin(self, call: StepCall, uow: UnitOfWork) -> Recorded | Go | Wait:
        session = self._session(uow, call.session_id)
        require_owner(call.session_id, session.user_id, call.user_id)
        recorded = self._sessions.outcome_of_request(
            session, call.key, call.step, call.input, model=call.asked
        )
        search, load = self._sessions.events_holding, self._store.load
        if recorded is not None:
            require_same_merge(session, recorded, call.input, call.merge_input, search, load)
            return Recorded(recorded, session.version, session.context)
        pending = session.pending.get(call.key)
        if pending is not None:
            session.ensure_same_request(pending, call.key, call.step, model=call.asked, input=call.input)
            require_same_merge(session, pending, call.input, call.merge_input, search, load)
            if uow.now < pending.lease_until:
                return Wait(pending.lease_until)
            session.abandon_step(call.key, uow.now, "the worker's lease lapsed")
        session.ensure_open(uow.now)
        if call.merge_input:
            changed = changed_keys(session.context, call.input)
            if changed:
                session.update_context(changed)
        messages = step_messages(
            step=call.step, previous_step=session.current_step, context=session.context, input=call.input
        )
        reaped = tuple(lapsed_others(session.pending, call.key, uow.now))
        for held in reaped:
            reason = f"the worker's lease lapsed; given up when {call.key!r} started"
            session.abandon_step(held.idempotency_key, uow.now, reason)
        session.start_step(
            step=call.step,
            input=call.input,
            model=call.model_key,
            key=call.key,
            now=uow.now,
            lease_until=uow.now + self.lease,
            worker=self.worker,
        )
        return Go(messages, uow.now, session.workflow, session.user_id, lost=pending, reaped=reaped)

    async def _call_and_record(self, llm: LlmPort, call: StepCall, go: Go) -> StepOutcome:
        attempt = self._attempts.begin(call, go)
        if attempt is None:  # the close began while StepStarted was saved
            given_up = False
            with contextlib.suppress(Exception):
                message = "the engine closed before the model was called"
                await self._record_failure(call, go, ENGINE_CLOSED, message, None)
                given_up = True
            raise StepInterrupted(call.session_id, call.key, given_up=given_up)
        try:
            return await self._attempt(llm, call, go, attempt)
        except EngineClosed as error:
            # Closed after StepStarted was saved (before the hold, or while a failure was
            # recorded): a bare EngineClosed named no key, and the caller that gave none could
            # not retry the step it had begun.
            if isinstance(error, StepInterrupted):
                raise
            raise StepInterrupted(
                call.session_id, call.key, given_up=self._attempts.given_up(attempt)
            ) from error
        finally:
            self._attempts.end(attempt)

    async def _attempt(self, llm: LlmPort, call: StepCall, go: Go, attempt: Attempt) -> StepOutcome:
        hold = await self._reserve(llm, call, go)
        if not self._attempts.held(attempt, hold):  # given up by the close: the model not called
            with contextlib.suppress(Exception):
                await self._settle(hold, None)
            raise StepInterrupted(call.session_id, call.key, given_up=True)
        reply = await self._call(llm, call, go, hold, attempt)  # a failure is recorded and settled there
        if not self._attempts.answered(attempt):
            # Answered after the close gave the step up (and recorded it as engine_closed).
            raise AnswerNotSaved(call.session_id, call.key, given_up=True)
        # The model answered and was paid for: its settlement and StepProcessed are written
        # whatever happens to the caller now. Cancelled between the two, the step stayed
        # pending with its cost in the ledger and in no event, and a retry paid again.
        recording = asyncio.ensure_future(self._record_reply(call, go, reply, hold))
        try:
            return await asyncio.shield(recording)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await recording
            raise

    async def _record_reply(
        self, call: StepCall, go: Go, reply: LlmReply, hold: Reservation | None
    ) -> StepOutcome:
        unsettled = hold
        # One moment for the ledger and the event: the budgets' day and the dashboard's are
        # the same for a call held before midnight and answered after it.
        at = self._store.clock()
        try:
            await self._settle(hold, reply.usage, at=at)
            unsettled = None
            outcome: StepOutcome | Recorded | Unrecordable | str = await self._in_db(
                partial(self._store.write, now=at), call.session_id, partial(self._finish, call, reply)
            )
        except (StoreUnavailable, ConcurrentUpdate) as error:
            # The answer was paid for. Given up on here, the step stayed pending, a retry waited
            # out its lease, recorded worker_lost and called the model again, and this answer's
            # cost was in no event: keep saving it, holding the key, and let the caller know now.
            # (Saves that lost every race to other writers, ConcurrentUpdate, likewise.) Refused
            # once the engine is closing (AnswerNotSaved, naming the key).
            try:
                self._save_later(call, go, reply, unsettled, at)
            except AnswerNotSaved as refused:
                raise refused from error
            except RuntimeError as no_thread:  # the caller got it bare ("can't start new thread")
                told = not_kept(error, call.key, no_thread)
                raise told from (no_thread if told is error else error)
            told = being_saved(error, call.key) if isinstance(error, StoreUnavailable) else error
            if told is error:
                raise
            raise told from error
        except EngineClosed as error:
            # Closed while the model answered: the caller was told a bare EngineClosed naming no
            # key, although the step was begun and its answer paid for.
            raise AnswerNotSaved(call.session_id, call.key) from error
        except FlowledgerError:
            raise
        except Exception as error:
            # A bug, not an outage nor the model: raised as it was, the step stayed pending
            # until its lease lapsed and every caller of its key waited that long.
            raise await self._fail_unrecorded(call, go, reply, unsettled, error, at) from error
        if isinstance(outcome, str):
            raise SessionClosed(call.session_id, outcome)
        if isinstance(outcome, Unrecordable):
            raise outcome.error
        if isinstance(outcome, Recorded):
            return await self._as_recorded(call, outcome)
        return outcome

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

    def _save_later(
        self, call: StepCall, go: Go, reply: LlmReply, unsettled: Reservation | None, at: datetime
    ) -> None:
        """``_keep_saving`` on a thread of its own, in an event loop of its own: a task of the
        caller's loop was cancelled when that loop ended (a script running each step with
        ``asyncio.run``), the answer, paid for, then in no event and the model called again by
        the retry. AnswerNotSaved once the engine's close has stopped taking answers."""
        self._savers.start(
            partial(self._keep_saving, call, go, reply, unsettled, at), call.session_id, call.key
        )

    async def _keep_saving(
        self, call: StepCall, go: Go, reply: LlmReply, unsettled: Reservation | None, at: datetime
    ) -> None:
        """Save an answer the store would not take (settling its hold first, if that failed too),
        for at most ``save_retry_s``, the step's lease renewed meanwhile, so that a retry of the
        key waits for this answer. The store retries each save until its deadline; between
        saves it pauses 0.1 s, doubling up to 1 s, so that the answer is saved within about a
        second of the database's return, before a waiter can see the lease lapse and take over."""
        renewer = self._renewer(call, go, first_in=0.0)  # it may have lapsed while we tried
        pause, deadline = 0.1, time.monotonic() + self.save_retry_s
        try:
            while time.monotonic() + pause < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
                try:
                    if unsettled is not None:
                        # it may have committed
                        await self._settle(unsettled, reply.usage, held_only=True, at=at)
                        unsettled = None
                    write = partial(self._store.write, now=at)
                    await self._in_db(write, call.session_id, partial(self._finish, call, reply))
                    return
                except (StoreUnavailable, ConcurrentUpdate):
                    continue
        except FlowledgerError:
            return  # the engine was closed, or the like: nothing more can be done here
        except Exception as error:  # a bug: fail the step rather than leave it to lapse
            with contextlib.suppress(Exception):
                await self._fail_unrecorded(call, go, reply, unsettled, error, at)
        finally:
            renewer.stop()

    async def _fail_unrecorded(
        self,
        call: StepCall,
        go: Go,
        reply: LlmReply,
        unsettled: Reservation | None,
        error: Exception,
        at: datetime,
    ) -> LlmError:
        """Record an answer that ``_finish`` failed on (``error``, a bug) as StepFailed, with
        what the call cost, so that its key is not held until the lease lapses; return the
        error its caller is told. Failing with the usage (it may be what broke), it is recorded
        without; failing again, the lease is left to lapse and the caller is told all the same."""
        usage = reply.usage if isinstance(reply.usage, LlmUsage) else None
        if unsettled is not None:
            with contextlib.suppress(Exception):
                await self._settle(unsettled, usage, at=at)
        told = unrecorded_answer(error, usage)
        for known in (usage, None):
            try:
                await self._record_failure(call, go, told.error_type, told, known, now=at)
                break
            except Exception:
                continue
        return told

    async def _reserve(self, llm: LlmPort, call: StepCall, go: Go) -> Reservation | None:
        """Hold the call's estimated maximum cost in its budgets; refuse it, recorded and unsent,
        when an enforced budget cannot take it (``StepFailed("budget_exceeded")``)."""
        budgets = self.budgets
        if budgets is None or budgets.known_idle():
            return None
        try:
            model, amount = held_estimate(llm, call.model, go.messages)
        except Exception as error:  # StepStarted is written: never leave the step pending
            await self._record_failure(call, go, type(error).__name__, error, None)
            raise
        scope = CallScope(
            tenant=budgets.tenant, session=call.session_id, workflow=go.workflow, model=model, user=go.user_id
        )
        session = self._sessions.session_uuid(call.session_id)
        lost_holds = tuple(
            step_hold_id(session, held.idempotency_key, held.worker, held.started_at)
            for held in (*(() if go.lost is None else (go.lost,)), *go.reaped)
        )
        # As in _begin_surely: the reservation runs to its end on its thread, so a caller
        # cancelled meanwhile can release what it holds.
        reserving = self._db_future(
            _hold,
            budgets,
            scope,
            amount,
            step_hold_id(session, call.key, self.worker, go.started_at),
            lost_holds,
        )
        try:
            return await asyncio.shield(reserving)
        except BudgetExceeded as error:
            # Named, no request made (attempts 0), as the open breaker's refusal: without usage
            # the cost dashboard counted it under no model.
            refused = LlmUsage(request_model=model or call.model or "", attempts=0)
            await self._record_failure(call, go, "budget_exceeded", error, refused)
            raise
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._settle(await reserving, None)
            await self._record_failure(call, go, "cancelled", _CANCELLED, None)
            raise
        except Exception as error:
            await self._record_failure(call, go, type(error).__name__, error, None)
            raise

    async def _settle(
        self,
        hold: Reservation | None,
        usage: LlmUsage | None,
        *,
        held_only: bool = False,
        at: datetime | None = None,
    ) -> None:
        """Put the call's recorded cost in place of its hold, in the budgets' windows holding
        ``at`` (the stamp of the event that records the call; None: now); alerts go out without
        waiting. ``held_only``: tried again, it records nothing once the hold is gone."""
        if hold is None or self.budgets is None:
            return
        cost = call_cost(usage, hold)  # its hold per attempt whose cost is not known
        raised = await asyncio.shield(
            self._in_db(partial(self.budgets.settle, held_only=held_only, at=at), hold, cost)
        )
        self.budgets.notify(raised)

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
                    raise StepInterrupted(call.session_id, call.key, given_up=True) from error
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
            await asyncio.shield(self._fail_and_settle(call, go, hold, "cancelled", _CANCELLED, usage, usage))
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
            await self._settle(hold, billed, at=at)

    def _finish(
        self, call: StepCall, reply: LlmReply, uow: UnitOfWork
    ) -> StepOutcome | Recorded | Unrecordable | str:
        session = self._session(uow, call.session_id)
        # A worker that took this step over may have finished first: never record twice.
        recorded = self._sessions.find_outcome(session, call.key)
        if recorded is not None:
            found = Recorded(recorded, session.version, session.context)
            if recorded.usage != reply.usage and reply.usage is not None:
                # Another worker took the step over (this one stalled past its lease) and
                # finished first: its step stands, and this call was paid for too. Keep the
                # cost on the books, under no key (the key's outcome is the step recorded).
                session.fail_step(
                    step=call.step,
                    error_type="superseded",
                    error_message=f"answered after another worker recorded the step under {call.key!r}",
                    usage=storable_usage(reply.usage),
                )
            return found
        closed = "erased" if session.erased else session.status
        if closed != SessionStatus.ACTIVE:
            # Closed (or its user forgotten) while the model answered: keep what the call
            # cost, take no step: an erased session takes no more personal data.
            session.fail_step(
                step=call.step,
                error_type="session_closed",
                idempotency_key=call.key,
                usage=reply.usage,
                error_message=f"the session was {closed} when the model answered",
                error_detail=failure_detail(SessionClosed(call.session_id, closed)),
            )
            return str(closed)
        try:
            decision = parse_step_reply(
                reply.content, finish_reasons=reply.usage.finish_reasons, refusal=reply.refusal
            )
            record = session.record_step(
                step=call.step,
                input=call.input,
                output=decision.output(),
                next_step=decision.next_step,
                context_update=decision.context_update,
                usage=reply.usage,
                idempotency_key=call.key,
                model=call.model_key,
            )
        except ValidationError as error:
            # The call's own fields were checked when it began: the model's reply is what the
            # ledger cannot store (a NUL in its text, a name past its bounds). It was paid
            # for: keep its usage on a StepFailed, and tell the caller it was the reply.
            usage = storable_usage(reply.usage)
            unrecordable = LlmError(
                storable(f"the model's reply cannot be recorded: {error}", 1_000),
                error_type="malformed_response",
                attempts=usage.attempts if usage is not None else 1,
                usage=usage,
            )
            session.fail_step(
                step=call.step,
                error_type=unrecordable.error_type,
                error_message=str(unrecordable),
                usage=usage,
                idempotency_key=call.key,
                error_detail=failure_detail(unrecordable),
            )
            return Unrecordable(unrecordable)
        # Context is replaced, never changed in place, by the session: no copy needed.
        return StepOutcome(record, session.context)

    def _holds(self, session: Session, call: StepCall, go: Go) -> bool:
        """Whether the step pending under the call's key is still this attempt: started by
        this worker when it began. Taken over (its lease lapsed while it stalled), it is not."""
        pending = session.pending.get(call.key)
        return pending is not None and pending.worker == self.worker and pending.started_at == go.started_at

    def _renew(self, call: StepCall, go: Go, uow: UnitOfWork) -> bool:
        session = self._session(uow, call.session_id)
        if not self._holds(session, call, go):
            return False
        session.renew_lease(call.key, uow.now + self.lease)
        return True

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
            partial(self._fail, call, go, error_type, error, usage),
        )

    def _fail(
        self,
        call: StepCall,
        go: Go,
        error_type: str,
        error: BaseException | str,
        usage: LlmUsage | None,
        uow: UnitOfWork,
    ) -> None:
        session = self._session(uow, call.session_id)
        message = str(error)
        # What an adapter raised is recorded whatever it holds (a NUL in a custom adapter's
        # error type, usage past its bounds): refused, the step stayed pending until its lease
        # lapsed, and the caller got a ValidationError about the adapter's own error.
        error_type = storable_name(error_type, "unknown")
        usage = storable_usage(usage)
        if self._holds(session, call, go):
            session.fail_step(
                step=call.step,
                error_type=error_type,
                error_message=message,
                usage=usage,
                idempotency_key=call.key,
                error_detail=None if isinstance(error, str) else failure_detail(error),
            )
        elif usage is not None:
            # Taken over while this worker stalled: the key is another attempt's now (a failure
            # recorded under it would end that attempt's live step, and the next caller would
            # call the model a third time). What this call cost stays on the books, under no key.
            session.fail_step(
                step=call.step,
                error_type="superseded",
                error_message=f"failed ({error_type}: {message}) after another worker took over {call.key!r}",
                usage=storable_usage(usage),
            )

    async def _await_outcome(self, call: StepCall) -> StepOutcome | None:
        """Poll while a live worker holds the key; None once it does not (decide afresh).

        A failure recorded under the key is raised as the error its caller got, unless it
        said nothing of the request (``step_failures.waiter_error``): then None as well.
        """
        deadline = time.monotonic() + self.wait_timeout_s
        interval = self.poll_interval_s
        while True:
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

    def _session(self, uow: UnitOfWork, session_id: str) -> Session:
        session: Session | None = uow.find(self._sessions.session_uuid(session_id))
        if session is None:
            raise SessionNotFound(session_id)
        return session

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
            renew = partial(self._store.write, call.session_id, partial(self._renew, call, go))
            return context.copy().run(renew)

        return LeaseRenewer(
            renewal, self.executor.submit, self._store.settings.step_lease_s, first_in=first_in
        )


def _hold(
    budgets: BudgetService, scope: CallScope, amount: Decimal, hold: UUID, lost: tuple[UUID, ...]
) -> Reservation | None:
    """On a database thread: take the holds of the attempts this one took over or gave up as
    spent at their estimate (their workers were lost, what their calls cost is not known: not
    $0; they were left to lapse and be released), then hold this call's estimate as ``hold``."""
    for lost_hold in lost:
        budgets.notify(budgets.spend_lost(lost_hold))  # off the loop: webhooks go out on a thread
    return budgets.reserve(scope, amount, hold)
