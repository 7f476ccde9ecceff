"""Calls that may hang, run so that the test does not: on a thread, waited for a bounded time."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from flowledger.domain.errors import StoreUnavailable

SLACK_S = 0.6
"""What a call may run past its operation deadline: the last pause's rounding, a cancelled
statement's grace, thread scheduling (docs/write-path.md promises 2.6 s for a 2 s deadline)."""


@dataclass
class Outcome:
    """How a call ended, if it ended within the wait: what it returned or raised, and when."""

    value: object = None
    error: BaseException | None = None
    took: float | None = None
    """Seconds the call ran; None while it is still running."""
    thread_id: int | None = None

    def still_running(self) -> str:
        """The failure message for a call still running: where its thread is now."""
        frame = sys._current_frames().get(self.thread_id or -1)
        where = "".join(traceback.format_stack(frame)[-25:]) if frame is not None else "(thread gone)"
        return f"still running when the wait ended, at:\n{where}"


def within(wait_s: float, call: Callable[[], object]) -> Outcome:
    """Run ``call`` on a thread and wait for it at most ``wait_s`` (a hung call must not hang
    the test: it is released when the test ends the stall)."""
    outcome = Outcome()

    def run() -> None:
        started = time.monotonic()
        try:
            outcome.value = call()
        except BaseException as error:  # the test looks at it
            outcome.error = error
        outcome.took = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True, name="bounded-call")
    thread.start()
    outcome.thread_id = thread.ident
    thread.join(wait_s)
    return outcome


def assert_unavailable_in_time(outcome: Outcome, deadline_s: float) -> None:
    """The call raised StoreUnavailable within ``deadline_s`` and the slack."""
    assert outcome.took is not None, outcome.still_running()
    assert isinstance(outcome.error, StoreUnavailable), repr(outcome.error)
    assert outcome.took < deadline_s + SLACK_S, outcome.took


def assert_done_in_time(outcome: Outcome, limit_s: float) -> None:
    """The call returned (raised nothing) within ``limit_s``."""
    assert outcome.took is not None, outcome.still_running()
    assert outcome.error is None, repr(outcome.error)
    assert outcome.took < limit_s, outcome.took
