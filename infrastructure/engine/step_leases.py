"""A step's lease, kept alive while its model call runs (``steps.py``).

Renewals are timed by one scheduler thread per process and written on the engine's database
threads, never on the caller's event loop: a loop that the model call blocks (a blocking
client inside the async port) or that is busy elsewhere for longer than the lease must not
let the lease lapse while its worker lives. An outside probe, 1 s leases, a model call that
blocked its loop for 4 s: the renewals (loop timers) never ran, a caller in another engine
took the step over after 1.5 s and the model was called twice for one key.

A renewal that fails in an outage is tried again within a fraction of a second, not a period
later: it has already waited its operation deadline, and a deadline longer than a third of the
lease left the next try past the lease's end. An outside probe (3 s leases, a 1.5 s deadline,
the database away for 2.6 s right after a renewal): the lease lapsed with the database back for
0.4 s, and a caller elsewhere took the step over from the living worker.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from collections.abc import Callable
from time import monotonic

from flowledger.domain.errors import (
    ConcurrentUpdate,
    EngineClosed,
    FlowledgerError,
    StoreRefused,
    StoreUnavailable,
)

RETRY_S = 0.25
"""Between renewals that failed for an outage (or lost races to other writers): the store has
waited its deadline (or its retries) already; the database may be back any moment."""


class _Scheduler:
    """One daemon thread that calls each renewer's ``_due`` at its time (a heap of times)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, LeaseRenewer]] = []
        self._order = itertools.count()
        self._wake = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def at(self, when: float, renewer: LeaseRenewer) -> None:
        with self._wake:
            entry = (when, next(self._order), renewer)
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="flowledger-leases")
                self._thread.start()
            elif self._heap[0] is entry:  # sooner than the thread is waiting for
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > monotonic():
                    self._wake.wait(None if not self._heap else self._heap[0][0] - monotonic())
                _, _, renewer = heapq.heappop(self._heap)
            try:
                renewer._due()
            except Exception:  # never let one renewer stop every other's
                renewer.stop()


_SCHEDULER = _Scheduler()


def _reset_after_fork() -> None:
    """A forked child has no scheduler thread (nor its parent's renewers): start afresh."""
    global _SCHEDULER
    _SCHEDULER = _Scheduler()


os.register_at_fork(after_in_child=_reset_after_fork)


class LeaseRenewer:
    """Renews a step's lease every third of its length while the model answers.

    A heap entry, not a task nor a thread: most calls end long before the first renewal, and
    a stopped renewer costs its entry until its time comes.
    """

    __slots__ = ("_period", "_renewal", "_stopped", "_submit")

    def __init__(
        self,
        renewal: Callable[[], bool],
        submit: Callable[[Callable[[], None]], object],
        lease_s: float,
        *,
        first_in: float | None = None,
    ) -> None:
        """``renewal()`` writes one renewal (blocking) and says whether the step is still this
        worker's; ``submit(fn)`` runs ``fn`` on a database thread. The first renewal comes
        after a third of ``lease_s`` (or ``first_in``)."""
        self._renewal = renewal
        self._submit = submit
        self._period = lease_s / 3
        self._stopped = False
        _SCHEDULER.at(monotonic() + (self._period if first_in is None else first_in), self)

    def stop(self) -> None:
        """No more renewals (one already on its way finishes on its thread)."""
        self._stopped = True

    def _due(self) -> None:
        """On the scheduler's thread: hand the renewal to a database thread."""
        if self._stopped:
            return
        try:
            self._submit(self._renew)
        except RuntimeError:  # the engine's threads were shut down (Engine.close)
            self._stopped = True

    def _renew(self) -> None:
        if self._stopped:
            return
        wait = self._period
        try:
            still_held = self._renewal()
        except EngineClosed:
            return  # nothing more will be written through this engine
        except StoreRefused:
            still_held = True  # refused for good, most likely: no sooner than the next period
        except (StoreUnavailable, ConcurrentUpdate):
            still_held, wait = True, min(RETRY_S, self._period)  # away for now: try again soon
        except FlowledgerError:
            still_held = True  # try again at the next period
        except Exception:
            return  # a bug, not an outage: stop renewing rather than hide it in a loop
        if still_held and not self._stopped:
            _SCHEDULER.at(monotonic() + wait, self)
