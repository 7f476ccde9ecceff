"""A model step's budget hold (``steps.py``): the call's estimated maximum held before the model
is called (refused, recorded and unsent, when an enforced budget cannot take it), and settled at
what the call cost once its outcome is known.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any, Protocol, TypeVar
from uuid import UUID

from flowledger.domain.budget import CallScope
from flowledger.domain.errors import BudgetExceeded
from flowledger.domain.ports import LlmPort
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.budgets import BudgetService, call_cost, held_estimate, step_hold_id
from flowledger.infrastructure.engine.sessions import SessionService
from flowledger.infrastructure.engine.step_calls import Go, StepCall
from flowledger.infrastructure.postgres.budgets import Reservation

T = TypeVar("T")
CANCELLED = "the caller cancelled the step"
"""The message a cancelled caller's step is recorded failed with."""


class RecordFailure(Protocol):
    """``StepService._record_failure``: record the attempt as failed, with ``error``'s message."""

    def __call__(
        self,
        call: StepCall,
        go: Go,
        error_type: str,
        error: BaseException | str,
        usage: LlmUsage | None,
        *,
        now: datetime | None = None,
    ) -> Awaitable[None]: ...


class StepHolds:
    """The holds of one worker's attempts, in ``budgets`` (None: no budgets)."""

    def __init__(
        self,
        budgets: BudgetService | None,
        sessions: SessionService,
        worker: str,
        db_future: Callable[..., asyncio.Future[Any]],
        record_failure: RecordFailure,
    ) -> None:
        self.budgets = budgets
        self._sessions = sessions
        self._worker = worker
        self._db_future = db_future
        """``StepService._db_future``: work on a database thread, as a future of the caller's loop."""
        self._record_failure = record_failure

    async def _in_db(self, function: Callable[..., T], *args: Any) -> T:
        result: T = await self._db_future(function, *args)
        return result

    async def reserve(self, llm: LlmPort, call: StepCall, go: Go) -> Reservation | None:
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
            step_hold_id(session, call.key, self._worker, go.started_at),
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
                await self.settle(await reserving, None)
            await self._record_failure(call, go, "cancelled", CANCELLED, None)
            raise
        except Exception as error:
            await self._record_failure(call, go, type(error).__name__, error, None)
            raise

    async def settle(
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
        budgets = self.budgets
        if hold is None or budgets is None:
            return
        cost = call_cost(usage, hold)  # its hold per attempt whose cost is not known
        raised = await asyncio.shield(
            self._in_db(partial(budgets.settle, held_only=held_only, at=at), hold, cost)
        )
        budgets.notify(raised)


def _hold(
    budgets: BudgetService, scope: CallScope, amount: Decimal, hold: UUID, lost: tuple[UUID, ...]
) -> Reservation | None:
    """On a database thread: take the holds of the attempts this one took over or gave up as
    spent at their estimate (their workers were lost, what their calls cost is not known: not
    $0; they were left to lapse and be released), then hold this call's estimate as ``hold``."""
    for lost_hold in lost:
        budgets.notify(budgets.spend_lost(lost_hold))  # off the loop: webhooks go out on a thread
    return budgets.reserve(scope, amount, hold)
