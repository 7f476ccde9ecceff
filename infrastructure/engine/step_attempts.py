"""The step attempts an engine has begun (their StepStarted saved) and not yet settled, and what
its close does with them (``StepService.close``).

An attempt whose model has not answered when the engine closes is given up: its model call is
cancelled and the close records it as failed (``engine_closed``), so that its key is free at
once. It stayed pending until its lease lapsed: an outside probe, 8 threads in ``process_step``
and a close, left 6-8 steps pending a run, and each retry waited out the lease (15 s) and called
the model again. An attempt whose model has answered is left to record its answer: the close
waits for it (within ``close_wait_s``), as for the answers being saved in the background.

A call the close gives up may be paid for all the same: it answered as its cancel landed, or its
cancelled attempt said what it used. The close waits (within the same ``close_wait_s``) for the
cancelled calls to end, and records what they used on their ``engine_closed`` failures: the answer
was dropped, and its tokens and cost were in no event. One that ends only after the close recorded
its step (its loop could not run meanwhile: the close's own, or a blocked one) is logged as a
warning with what it used (``told_given_up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flowledger.domain.errors import EngineClosed
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.step_calls import Go, StepCall
from flowledger.infrastructure.postgres.budgets import Reservation

_log = logging.getLogger(__name__)


class Stage(enum.Enum):
    """Where an attempt is: its model called, answered, or given up by the close."""

    CALLING = "calling"
    ANSWERED = "answered"
    GIVEN_UP = "given_up"


@dataclass(eq=False)
class Attempt:
    """One attempt at a step, from its StepStarted to its outcome (changed under the registry's lock)."""

    call: StepCall
    go: Go
    thread: int
    """The thread of the caller's event loop: a close on that thread cannot wait for it."""
    loop: asyncio.AbstractEventLoop
    stage: Stage = Stage.CALLING
    hold: Reservation | None = None
    """The attempt's budget hold once taken (settled by the close when it gives the attempt up)."""
    model_call: asyncio.Future[Any] | None = field(default=None, repr=False)
    usage: LlmUsage | None = None
    """What its model call used, when the call ended after the close gave the attempt up."""
    call_ended: bool = False
    """Its caller is done with the model call, after the close gave the attempt up."""
    recorded: bool = False
    """The close has recorded the attempt given up (or tried): what its call used is noted too late."""
    told: asyncio.Future[bool] | None = field(default=None, repr=False)
    """Whether the close recorded the attempt given up, for its caller (set on its loop)."""


@dataclass(frozen=True)
class GivenUpAtStart:
    """A step whose StepStarted was saved as the close began: given up on the database thread
    that saved it, ``recorded`` as failed (``engine_closed``) or not (the store would not)."""

    recorded: bool


class StepAttempts:
    """The attempts of one ``StepService``; ``give_up`` and ``wait_answered`` are its close."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._attempts: set[Attempt] = set()
        self._opening: list[int] = []
        """The threads of the callers whose StepStarted is being saved (one entry per caller)."""
        self._closing = False

    @contextlib.contextmanager
    def opening(self, *, refuse: bool = False) -> Iterator[None]:
        """While a caller saves its StepStarted and, if the close began meanwhile, records it given
        up: the close waits for it (``wait_answered``), so that the store is still open for that.
        (A start saved just after the close began could not be recorded given up any more: an
        outside probe saw one step in a few runs left pending, its retry waiting out the lease.)
        Entered by the database thread that saves it, so that a close on the caller's loop's own
        thread waits too (entered by the loop, a close there could not wait, nor a close made in
        the save itself wait for anything but its own bound); ``refuse``: EngineClosed, nothing
        begun, once the close has begun (a save still queued when the close began)."""
        here = threading.get_ident()
        with self._changed:
            if refuse and self._closing:
                raise EngineClosed("process a step")
            self._opening.append(here)
        try:
            yield
        finally:
            with self._changed:
                self._opening.remove(here)
                self._changed.notify_all()

    @property
    def closing(self) -> bool:
        """Whether the close has begun."""
        with self._changed:
            return self._closing

    def begin(self, call: StepCall, go: Go, loop: asyncio.AbstractEventLoop, thread: int) -> Attempt | None:
        """Register an attempt that ``loop`` (run by ``thread``) runs, from the database thread
        that saved its StepStarted; None once the close has begun."""
        attempt = Attempt(call, go, thread, loop, told=loop.create_future())
        with self._changed:
            if self._closing:
                return None
            self._attempts.add(attempt)
        return attempt

    def held(self, attempt: Attempt, hold: Reservation | None) -> bool:
        """Note the attempt's budget hold; False when the close gave it up meanwhile (the hold is
        then the caller's to release)."""
        with self._changed:
            if attempt.stage is Stage.GIVEN_UP:
                return False
            attempt.hold = hold
            return True

    def calling(self, attempt: Attempt, model_call: asyncio.Future[Any]) -> None:
        """Note the attempt's model call, cancelled at once when the close gave it up meanwhile."""
        with self._changed:
            attempt.model_call = model_call
            given_up = attempt.stage is Stage.GIVEN_UP
        if given_up:
            model_call.cancel()

    def answered(self, attempt: Attempt) -> bool:
        """Mark the attempt's model answered; False when the close gave it up first."""
        with self._changed:
            if attempt.stage is Stage.GIVEN_UP:
                return False
            attempt.stage = Stage.ANSWERED
            return True

    async def told_given_up(self, attempt: Attempt, usage: object, bound_s: float) -> bool:
        """For the caller of an attempt the close gave up, once done with its model call (which
        ``usage`` says what it used, when known): whether the close recorded the attempt, so that
        a retry runs it at once (False: it could not, the step is left to its lease), waited for
        up to ``bound_s``. What the call used goes on the close's record; noted after it, it is
        logged as a warning (it is then in no event)."""
        paid = usage if isinstance(usage, LlmUsage) else None
        with self._changed:
            attempt.call_ended = True
            late = attempt.recorded and paid is not None
            if not attempt.recorded:
                attempt.usage = paid
            self._changed.notify_all()
        if late and paid is not None:
            _log_unrecorded_usage(attempt.call, paid)
        told = attempt.told
        if told is None:
            return False
        try:
            return await asyncio.wait_for(asyncio.shield(told), bound_s)
        except TimeoutError:
            return False

    def settled(self, attempt: Attempt, recorded: bool) -> None:
        """Tell the caller of an attempt given up whether the close recorded it (once; from any
        thread)."""
        told = attempt.told
        if told is None:
            return
        with contextlib.suppress(RuntimeError):  # its loop has ended: nobody to tell
            attempt.loop.call_soon_threadsafe(_tell, told, recorded)

    def given_up(self, attempt: Attempt) -> bool:
        """Whether the close gave the attempt up."""
        with self._changed:
            return attempt.stage is Stage.GIVEN_UP

    def end(self, attempt: Attempt) -> None:
        """The attempt is settled (or abandoned): the close waits for it no more."""
        with self._changed:
            self._attempts.discard(attempt)
            self._changed.notify_all()

    def give_up(self) -> list[Attempt]:
        """Take no more attempts; give up those whose model has not answered, their model calls
        cancelled, and return them (with their holds) for the close to record."""
        with self._changed:
            self._closing = True
            given_up = [a for a in self._attempts if a.stage is Stage.CALLING]
            for attempt in given_up:
                attempt.stage = Stage.GIVEN_UP
        for attempt in given_up:
            model_call = attempt.model_call
            if model_call is not None:
                with contextlib.suppress(RuntimeError):  # its loop has ended
                    attempt.loop.call_soon_threadsafe(model_call.cancel)
        return given_up

    def wait_calls_ended(self, given_up: list[Attempt], deadline: float) -> None:
        """Wait until the model calls of the attempts the close ``given_up`` (cancelled) have
        ended, so that what they used is known, or until ``deadline`` (``time.monotonic``); not
        for those of the calling thread's own loop, which cannot go on while it waits."""
        here = threading.get_ident()
        with self._changed:
            while any(
                a in self._attempts and a.model_call is not None and not a.call_ended and a.thread != here
                for a in given_up
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)

    def recording(self, attempt: Attempt) -> LlmUsage | None:
        """What the given-up attempt's call used, as the close records it (None: not known);
        noted later, it is logged instead (``told_given_up``)."""
        with self._changed:
            attempt.recorded = True
            return attempt.usage

    def wait_answered(self, deadline: float) -> None:
        """Wait until the attempts whose model answered have recorded it and the starts being
        saved are settled (``opening``), or until ``deadline`` (``time.monotonic``); not for those
        of the calling thread's own loop, which cannot go on while it waits."""
        here = threading.get_ident()
        with self._changed:
            while any(a.stage is Stage.ANSWERED and a.thread != here for a in self._attempts) or any(
                thread != here for thread in self._opening
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)


def _tell(told: asyncio.Future[bool], recorded: bool) -> None:
    if not told.done():
        told.set_result(recorded)


def _log_unrecorded_usage(call: StepCall, usage: LlmUsage) -> None:
    _log.warning(
        "session %r, idempotency key %r: the model call ended after the engine's close recorded"
        " the step as engine_closed, and what it used is in no event: %d input tokens, %d output"
        " tokens, $%s (%s, %d attempts)",
        call.session_id,
        call.key,
        usage.input_tokens,
        usage.output_tokens,
        usage.charged_usd,
        usage.response_model or usage.request_model,
        usage.attempts,
    )
