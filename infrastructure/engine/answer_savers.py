"""The answers ``StepService`` keeps saving after their caller was told the store is away, each
on a thread with an event loop of its own (``steps.py``), how an engine's close ends them, and
what their callers are told (``being_saved``, ``not_kept``).

Closing waits for the answers being saved, up to ``wait_s`` in all, then cancels the rest and
joins their threads; once it has stopped waiting no answer is taken any more (``AnswerNotSaved``,
naming the key to retry under). Both were races: an answer registered while ``close`` ran
(its thread started, its task not yet listed) was not cancelled and went on after close, an
answer registered after it got a saver that met the closed store and gave up, its caller told it
was being saved; and ``close`` cancelled an answer between two tries, the database back, so a
paid answer was never stored and a retry paid for it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from flowledger.domain.errors import (
    OUTCOME_UNKNOWN_NOTE,
    AnswerNotSaved,
    ConcurrentUpdate,
    FlowledgerError,
    StoreRefused,
    StoreUnavailable,
)

JOIN_S = 5.0
"""How long ``close`` waits for each cancelled saver's thread to end: a cancel ends it at its next
await (a write on a database thread is not waited for), so this is a bound, never reached."""


class _Saver:
    """One answer's save: a thread running ``save()`` in an event loop of its own."""

    def __init__(
        self, save: Callable[[], Coroutine[Any, Any, None]], ended: Callable[[_Saver], None]
    ) -> None:
        self._save = save
        self._ended = ended
        self._lock = threading.Lock()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # Run in a copy of the caller's context, as a task would be (``Engine.acting_as``).
        context = contextvars.copy_context()
        self.thread = threading.Thread(
            target=context.run, args=(self._run,), name="flowledger-answer-saver", daemon=True
        )

    def cancel(self) -> None:
        """Stop the save at its next await; not begun yet, it never begins."""
        with self._lock:
            self._cancelled = True
            if self._loop is not None and self._task is not None:
                with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                    self._loop.call_soon_threadsafe(self._task.cancel)

    def _run(self) -> None:
        try:
            with contextlib.suppress(asyncio.CancelledError):  # its engine closed: given up
                asyncio.run(self._main())
        finally:
            self._ended(self)

    async def _main(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
        await self._save()


class AnswerSavers:
    """The answers being saved in the background, and their closing (``close``)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: set[_Saver] = set()
        self._closed = False

    def start(self, save: Callable[[], Coroutine[Any, Any, None]], session_id: str, key: str) -> None:
        """Run ``save()`` on a thread of its own; AnswerNotSaved (naming ``key``) once closed, and
        RuntimeError when no thread can be started (nothing is left registered)."""
        with self._changed:
            if self._closed:
                raise AnswerNotSaved(session_id, key)
            saver = _Saver(save, self._end)
            self._running.add(saver)
            try:
                saver.thread.start()
            except RuntimeError:  # no thread to be had: left listed, close waited out its bound
                self._running.discard(saver)  # (and joined a thread never started: RuntimeError)
                raise

    @property
    def running(self) -> int:
        """Answers still being saved."""
        with self._changed:
            return len(self._running)

    def close(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` (in all) for the answers being saved (ones that come meanwhile too), then
        take no more, cancel the rest and wait for their threads to end."""
        deadline, here = time.monotonic() + wait_s, threading.current_thread()
        with self._changed:
            # (A saver closing its own engine does not wait for itself.)
            while any(s.thread is not here for s in self._running):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            self._closed = True
            left_over = list(self._running)
        for saver in left_over:
            saver.cancel()
        for saver in left_over:
            if saver.thread is not here:
                saver.thread.join(JOIN_S)

    def _end(self, saver: _Saver) -> None:
        with self._changed:
            self._running.discard(saver)
            self._changed.notify_all()


def being_saved(error: StoreUnavailable, key: str) -> StoreUnavailable:
    """The error for a caller whose paid answer is still being saved in the background: its
    outcome is unknown (the step will most likely be stored), said with the key to retry under.
    An outside probe saw the plain error (``outcome_unknown`` false) on steps stored a moment
    later; a caller that trusted it and retried without the key paid for a second call."""
    if isinstance(error, StoreRefused):
        return error
    # One already unknown (a commit cut off) said "retry with the same idempotency key" without
    # naming it: a caller that gave none could not, and paid for a second call.
    detail = error.detail.removesuffix(OUTCOME_UNKNOWN_NOTE)
    detail = f"{detail}; the model answered and its answer is being saved under idempotency key {key!r}"
    return StoreUnavailable(error.operation, detail, error.retry_after, outcome_unknown=True)


def not_kept(error: StoreUnavailable | ConcurrentUpdate, key: str, cause: Exception) -> FlowledgerError:
    """The error for a caller whose paid answer could be neither saved nor kept being saved (no
    thread to save it on): the store's own, naming the key that a retry takes the step over under
    once its lease lapses (the model is then called again)."""
    if not isinstance(error, StoreUnavailable) or isinstance(error, StoreRefused):
        return error
    detail = error.detail.removesuffix(OUTCOME_UNKNOWN_NOTE)
    detail = (
        f"{detail}; the model answered, and its answer could not be kept for a later save ({cause}):"
        f" retry under idempotency key {key!r} once the step's lease lapses"
    )
    return StoreUnavailable(error.operation, detail, error.retry_after, outcome_unknown=error.outcome_unknown)
