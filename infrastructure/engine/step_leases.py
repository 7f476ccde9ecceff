"""A step's lease, kept alive while its model call runs (``steps.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flowledger.domain.errors import FlowledgerError


class LeaseRenewer:
    """Renews a step's lease every third of its length while the model answers.

    A timer, not a task: most calls end long before the first renewal, and a timer that
    never fires costs one heap entry where a sleeping task cost a task, a future and a
    timer on every step.
    """

    __slots__ = ("_handle", "_loop", "_period", "_renewal", "_stopped")

    def __init__(
        self, renewal: Callable[[], asyncio.Future[bool]], lease_s: float, *, first_in: float | None = None
    ) -> None:
        """``renewal()`` starts one renewal on a database thread; its result: whether the step
        is still this worker's. The first comes after a third of ``lease_s`` (or ``first_in``)."""
        self._renewal = renewal
        self._loop = asyncio.get_running_loop()
        self._period = lease_s / 3
        self._stopped = False
        first = self._period if first_in is None else first_in
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(first, self._renew)

    def stop(self) -> None:
        """No more renewals (one already on its way finishes on its thread)."""
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()

    def _renew(self) -> None:
        self._handle = None
        self._renewal().add_done_callback(self._renewed)

    def _renewed(self, renewal: asyncio.Future[bool]) -> None:
        error = None if renewal.cancelled() else renewal.exception()
        if self._stopped or renewal.cancelled():
            return
        if error is None and not renewal.result():
            return  # the step is no longer this worker's
        if error is not None and not isinstance(error, FlowledgerError):
            return  # a bug, not an outage: stop renewing rather than hide it in a loop
        # Renewed, or the database is away for now: try again at the next period.
        self._handle = self._loop.call_later(self._period, self._renew)
