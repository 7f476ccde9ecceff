"""Charges of stored steps that the budget ledger could not take at once, and alerts the event
store could not append, tried again in order on one thread (``BudgetService.charge_stored``,
``BudgetService._record_alerts``).

A step is stored before its cost is charged; when the ledger is away the step's call still
returns, and its charge waits here. One thread serves every waiting charge, oldest first: while
the oldest fails, the others would too, so it alone is tried, with a pause doubling from 0.1 s
to 2 s; once it lands the next is tried at once. Each charge gives up ``retry_s`` after it was
queued (logged as an error); a closed engine drops them all. The thread ends when nothing waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from flowledger.domain.errors import FlowledgerError, StoreUnavailable

_log = logging.getLogger(__name__)
_FIRST_PAUSE_S = 0.1
_LONGEST_PAUSE_S = 2.0


class LaterCharges:
    """One queue and (while it holds anything) one thread for charges tried again."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self._waiting: deque[tuple[float, Callable[[], object]]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.given_up = 0
        """Charges dropped after ``retry_s`` (each also logged)."""

    def add(self, charge: Callable[[], object]) -> None:
        """Queue ``charge`` (it raises StoreUnavailable while the ledger is away; trying it
        again must be safe) and make sure the thread runs."""
        with self._lock:
            self._waiting.append((time.monotonic() + self.retry_s, charge))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="flowledger-budget-charges"
                )
                self._thread.start()

    @property
    def waiting(self) -> int:
        """Charges not yet landed."""
        return len(self._waiting)

    def _run(self) -> None:
        pause = _FIRST_PAUSE_S
        while True:
            with self._lock:
                if not self._waiting:
                    self._thread = None
                    return
                ends, charge = self._waiting[0]
            if time.monotonic() >= ends:
                self._drop("a stored step's cost (or a budget alert) could not be recorded within %s s")
                continue
            time.sleep(min(pause, max(0.0, ends - time.monotonic())))
            try:
                charge()
            except StoreUnavailable:
                pause = min(pause * 2, _LONGEST_PAUSE_S)
                continue
            except FlowledgerError:
                self._drop_all()  # the engine was closed, or the like: nothing more can be done
                continue
            with self._lock:
                self._waiting.popleft()
            pause = _FIRST_PAUSE_S

    def _drop(self, message: str) -> None:
        with self._lock:
            self._waiting.popleft()
            self.given_up += 1
        _log.error(message, self.retry_s)

    def _drop_all(self) -> None:
        with self._lock:
            dropped = len(self._waiting)
            self._waiting.clear()
        if dropped:
            _log.warning(
                "%s stored steps' charges dropped: the engine closed before the ledger came back", dropped
            )
