"""How ``StepService``'s close records the attempts it gave up (``step_attempts.py``): each as
``StepFailed("engine_closed")`` with what its call used, its budget hold settled, all within
``close_wait_s``; the steps it could not record (the database away) are left to their leases,
logged as a warning naming each session and key, and their callers told so.

The records were bounded by the store's ``operation_deadline_s`` each (15 s) and nothing said
that they had failed: an outside probe (3 steps in flight, the path to PostgreSQL cut, then
``close``) saw ``close`` take 45.03 s and log nothing, and each caller was told the step had
been given up and that a retry would run it at once, when it waited out the lease.

And how a step's start meets a close (``start_step``): registered, or given up, on the database
thread that saved its StepStarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial

from flowledger.domain.session_leases import ENGINE_CLOSED
from flowledger.infrastructure.engine.budgets import BudgetService, call_cost
from flowledger.infrastructure.engine.step_attempts import Attempt, GivenUpAtStart, StepAttempts
from flowledger.infrastructure.engine.step_calls import Go, Recorded, StepCall, Wait
from flowledger.infrastructure.engine.step_decisions import StepDecisions
from flowledger.infrastructure.engine.store import AggregateStore
from flowledger.infrastructure.operation_deadline import operation_until

_log = logging.getLogger(__name__)


def start_step(
    store: AggregateStore,
    decide: StepDecisions,
    attempts: StepAttempts,
    call: StepCall,
    loop: asyncio.AbstractEventLoop,
    thread: int,
) -> Recorded | Attempt | GivenUpAtStart | Wait:
    """On a database thread: write StepStarted and register the attempt there (run by ``loop``
    on ``thread``), so that a close begun meanwhile, on any thread, gives it up, or, begun first,
    has it recorded given up here (the close waits for this thread). Registered once the caller's
    loop ran again, a close on that loop's own thread had closed the store by then: an outside
    probe (8 steps, ``engine.close()`` called on their loop) saw a step left pending under its
    lease, its caller told given_up false."""
    with attempts.opening(refuse=True):
        begun = store.write(call.session_id, partial(decide.begin, call))
        if not isinstance(begun, Go):
            return begun
        attempt = attempts.begin(call, begun, loop, thread)
        if attempt is not None:
            return attempt
        message = "the engine closed before the model was called"
        try:
            store.write(call.session_id, partial(decide.fail, call, begun, ENGINE_CLOSED, message, None))
        except Exception:
            return GivenUpAtStart(recorded=False)
        return GivenUpAtStart(recorded=True)


def record_given_up(
    given_up: list[Attempt],
    attempts: StepAttempts,
    store: AggregateStore,
    decide: StepDecisions,
    budgets: BudgetService | None,
    within_s: float,
) -> None:
    """Record each attempt of ``given_up`` as failed (``engine_closed``) and settle its hold, all
    within ``within_s``; tell each caller whether its step was recorded (``attempts.settled``),
    and log the ones left to their leases."""
    left: list[tuple[Attempt, BaseException]] = []
    try:
        with operation_until(time.monotonic() + within_s):
            for attempt in given_up:
                error = _record(attempt, attempts, store, decide, budgets)
                attempts.settled(attempt, error is None)
                if error is not None:
                    left.append((attempt, error))
    finally:
        for attempt in given_up:
            attempts.settled(attempt, False)  # (a no-op for those told already)
    if left:
        _log.warning(
            "the engine closed without recording %d step(s) it gave up (%s): each stays pending until"
            " its lease lapses (step_lease_s %.0f s), then another worker takes it over: %s",
            len(left),
            _error_of(left[0][1]),
            store.settings.step_lease_s,
            ", ".join(f"session {a.call.session_id!r} key {a.call.key!r}" for a, _ in left),
        )


def _record(
    attempt: Attempt,
    attempts: StepAttempts,
    store: AggregateStore,
    decide: StepDecisions,
    budgets: BudgetService | None,
) -> BaseException | None:
    """Record one attempt given up, then settle its hold; the error that kept it from the log."""
    usage, at = attempts.recording(attempt), store.clock()
    try:
        store.write(attempt.call.session_id, partial(decide.fail_given_up, attempt, usage), now=at)
    except Exception as error:
        return error
    finally:
        if attempt.hold is not None and budgets is not None:
            with contextlib.suppress(Exception):  # the hold then lapses (its reservation's TTL)
                budgets.notify(
                    budgets.settle(attempt.hold, call_cost(usage, attempt.hold), held_only=True, at=at)
                )
    return None


def _error_of(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
