"""A model step's answer recorded (``steps.py``): its hold settled and StepProcessed saved at once,
or, when the store would not take it, saved in the background (``answer_savers.py``) while the
caller is told so; an answer the ledger cannot record because of a bug is recorded as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from flowledger.domain.errors import (
    AnswerNotSaved,
    ConcurrentUpdate,
    EngineClosed,
    FlowledgerError,
    LlmError,
    SessionClosed,
    StoreUnavailable,
)
from flowledger.domain.ports import LlmReply
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.answer_savers import AnswerSavers, being_saved, not_kept
from flowledger.infrastructure.engine.step_calls import Go, Recorded, StepCall, StepOutcome, Unrecordable
from flowledger.infrastructure.engine.step_decisions import StepDecisions
from flowledger.infrastructure.engine.step_failures import unrecorded_answer
from flowledger.infrastructure.engine.step_holds import RecordFailure, StepHolds
from flowledger.infrastructure.engine.step_leases import LeaseRenewer
from flowledger.infrastructure.engine.store import AggregateStore
from flowledger.infrastructure.postgres.budgets import Reservation

T = TypeVar("T")


class StepAnswers:
    """Records one worker's answers; ``savers`` holds those still being saved in the background."""

    save_retry_s: float = 120.0
    """How long a worker keeps trying to save a paid answer the store would not take. Below the
    budgets' RESERVATION_TTL_S (600 s): a settlement tried again counts only a hold still held."""

    def __init__(
        self,
        store: AggregateStore,
        decide: StepDecisions,
        holds: StepHolds,
        db_future: Callable[..., asyncio.Future[Any]],
        record_failure: RecordFailure,
        renewer: Callable[..., LeaseRenewer],
        as_recorded: Callable[[StepCall, Recorded], Awaitable[StepOutcome]],
        saving: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._store = store
        self._saving = saving
        """``StepAttempts.opening``: the close waits for the database thread saving an answer,
        whichever thread closes (the answer's own loop's too, which it cannot wait for)."""
        self._decide = decide
        self._holds = holds
        self._db_future = db_future
        self._record_failure = record_failure
        """``StepService._record_failure`` (stamped ``now=`` when given)."""
        self._renewer = renewer
        """``StepService._renewer``: renewals of an attempt's lease until stopped."""
        self._as_recorded = as_recorded
        # Answers still being saved after their caller was told the store is unavailable: each
        # on a thread of its own, with its own event loop (``_save_later``).
        self.savers = AnswerSavers()

    async def _in_db(self, function: Callable[..., T], *args: Any) -> T:
        result: T = await self._db_future(function, *args)
        return result

    async def record(self, call: StepCall, go: Go, reply: LlmReply, hold: Reservation | None) -> StepOutcome:
        unsettled = hold
        # One moment for the ledger and the event: the budgets' day and the dashboard's are
        # the same for a call held before midnight and answered after it.
        at = self._store.clock()
        try:
            await self._holds.settle(hold, reply.usage, at=at)
            unsettled = None
            outcome: StepOutcome | Recorded | Unrecordable | str = await self._in_db(
                self._finish, call, reply, at
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

    def _finish(
        self, call: StepCall, reply: LlmReply, at: datetime
    ) -> StepOutcome | Recorded | Unrecordable | str:
        """On a database thread: save the answer, the close waiting for it. Closed on the
        answer's own loop, the close did not wait and closed the store under the save: an
        outside probe saw a step left pending under its lease, its caller told AnswerNotSaved."""
        with self._saving():
            return self._store.write(call.session_id, partial(self._decide.finish, call, reply), now=at)

    def _save_later(
        self, call: StepCall, go: Go, reply: LlmReply, unsettled: Reservation | None, at: datetime
    ) -> None:
        """``_keep_saving`` on a thread of its own, in an event loop of its own: a task of the
        caller's loop was cancelled when that loop ended (a script running each step with
        ``asyncio.run``), the answer, paid for, then in no event and the model called again by
        the retry. AnswerNotSaved once the engine's close has stopped taking answers."""
        self.savers.start(
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
                        await self._holds.settle(unsettled, reply.usage, held_only=True, at=at)
                        unsettled = None
                    write = partial(self._store.write, now=at)
                    await self._in_db(write, call.session_id, partial(self._decide.finish, call, reply))
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
                await self._holds.settle(unsettled, usage, at=at)
        told = unrecorded_answer(error, usage)
        for known in (usage, None):
            try:
                await self._record_failure(call, go, told.error_type, told, known, now=at)
                break
            except Exception:
                continue
        return told
