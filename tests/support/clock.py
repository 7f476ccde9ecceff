"""A clock a test moves by hand, for engines built with ``Engine(clock=...)``."""

from __future__ import annotations

from datetime import datetime


class SetClock:
    """Answers ``now``, which the test sets."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
