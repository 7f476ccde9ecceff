"""A follower that lost the database tries again within seconds of its return, however long
the outage lasted: each try already spends the operation deadline reconnecting, so the wait
between tries stays short.

An outside probe (``flowledger projections follow``, 3 s deadline, the server stopped for
55 s): the waits doubled to 16 and then 30 s, and a session started as soon as the server was
back reached the read models 22.9 s later; the engine's own pool was back in 0.1 s.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import pytest

from flowledger.domain.errors import StoreUnavailable
from flowledger.projections.follow import follow_until_stopped

follow_module = importlib.import_module("flowledger.projections.follow")
"""The module (``flowledger.projections.follow`` is also the name of its function there)."""
MAX_WAIT_S = 2.0


class CountingStop(threading.Event):
    """A stop flag whose waits are recorded and end at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return False


def test_a_follower_tries_again_within_seconds_after_a_long_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a follower whose database stays away for twelve tries in a row
    failures = iter(range(12))

    def follow(*_: Any, **__: Any) -> int:
        if next(failures, None) is not None:
            raise StoreUnavailable("connect to the read models", "connection refused (tried for 3.0 s)")
        return 0

    monkeypatch.setattr(follow_module, "follow", follow)
    stop = CountingStop()
    announced: list[float] = []
    # When it follows until the database is back
    follow_until_stopped(object(), stop=stop, on_reconnect=lambda _, wait: announced.append(wait))  # type: ignore[arg-type]
    # Then it started with a short wait and never waited long between tries
    assert announced == stop.waits
    assert len(stop.waits) == 12
    assert stop.waits[0] == 0.5
    assert max(stop.waits) <= MAX_WAIT_S
