"""The engine's clock: the database server's time, carried forward, never stepping back."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from flowledger.infrastructure.engine.clock import DatabaseClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_the_clock_follows_the_server_not_the_host() -> None:
    # Given a server whose time is 2030, far from this host's
    clock = DatabaseClock(lambda: T0)
    # Then the clock reads 2030 and advances with real time
    first = clock()
    time.sleep(0.01)
    second = clock()
    assert T0 <= first < second < T0 + timedelta(seconds=1)


def test_a_resync_moves_forward_to_the_server_and_never_back() -> None:
    server = [T0]
    clock = DatabaseClock(lambda: server[0], resync_s=0.02)
    clock()
    # When the server's clock is found 10 s ahead at the next sync
    server[0] = T0 + timedelta(seconds=10)
    time.sleep(0.03)
    ahead = clock()
    assert ahead >= T0 + timedelta(seconds=10)
    # And then read behind what was carried forward (jitter): the clock does not step back
    server[0] = T0
    time.sleep(0.03)
    assert clock() >= ahead


def test_a_server_that_cannot_be_read_keeps_the_clock_counting() -> None:
    calls = [0]

    def flaky() -> datetime:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError("connection refused")
        return T0

    clock = DatabaseClock(flaky, resync_s=0.01)
    first = clock()
    time.sleep(0.02)
    assert clock() > first
    assert calls[0] >= 2
