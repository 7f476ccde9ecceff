"""A leaky bucket that every event loop and thread using one client shares (a model's limits)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


class SharedBucket:
    """``capacity`` units per ``period_s``, leaking at that rate, as aiolimiter's ``AsyncLimiter``
    counts them: a request fits while the level plus its amount is at most ``capacity``.

    aiolimiter's bucket belongs to the loop that first waits on it, so the limiter kept one per
    loop, and each loop had the whole rate: a script running ``asyncio.run`` once per step began
    every step with a full bucket (``rpm=2``: six requests in under a second). The level is
    kept under a thread lock, and a request that does not fit sleeps on its own loop until it
    may, then asks again.
    """

    def __init__(self, capacity: float, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._rate = capacity / period_s
        self._clock = clock
        self._level = 0.0
        self._at = clock()
        self._lock = threading.Lock()

    async def acquire(self, amount: float = 1.0) -> None:
        """Take ``amount`` (at most ``capacity``) once it fits, waiting for the bucket to leak."""
        while (wait := self._take(amount)) > 0:
            await asyncio.sleep(wait)

    def _take(self, amount: float) -> float:
        """Take ``amount`` and return 0, or return the seconds until it fits (nothing taken)."""
        with self._lock:
            now = self._clock()
            self._level = max(0.0, self._level - (now - self._at) * self._rate)
            self._at = now
            if self._level + amount <= self.capacity:
                self._level += amount
                return 0.0
            return (self._level + amount - self.capacity) / self._rate
