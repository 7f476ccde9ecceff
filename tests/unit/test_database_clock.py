"""The engine's clock: the database server's time, carried forward, never stepping back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from flowledger.infrastructure.engine.clock import DatabaseClock
from tests.support.bounded import within

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_the_clock_follows_the_server_not_the_host() -> None:
    # Given a server whose time is 2030, far from this host's
    clock = DatabaseClock(lambda: T0)
    # Then the clock reads 2030 and advances with real time
    first = clock()
    time.sleep(0.01)
    second = clock()
    assert T0 <= first < second < T0 + timedelta(seconds=1)


def test_a_resync_moves_forward_to_the_server() -> None:
    server = [T0]

    clock = DatabaseClock(lambda: server[0], resync_s=0.02)
    clock()
    # When the server's clock is found 10 s ahead at the next sync (it runs on its own thread)
    server[0] = T0 + timedelta(seconds=10)
    time.sleep(0.03)
    clock()
    assert _eventually(lambda: clock() >= T0 + timedelta(seconds=10))


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


def test_a_due_resync_never_makes_a_reader_wait_for_the_server() -> None:
    # (An outside probe: with the server stopped answering, create_task with a 3 s deadline
    # raised StoreUnavailable after 6 s. It read the clock before its write's deadline began,
    # the resync was due, and the reading waited its own 3 s budget for the server; on an
    # event loop (process_step's wait for a live worker) such a reading stalls every call.)
    answer = threading.Event()
    reads = [0]

    def stalled_after_the_first_read() -> datetime:
        reads[0] += 1
        if reads[0] > 1:
            answer.wait(5.0)
        return T0

    clock = DatabaseClock(stalled_after_the_first_read, resync_s=0.01)
    time.sleep(0.02)
    try:
        # When a reading finds the resync due while the server does not answer
        read = within(2.0, clock)
        # Then it is answered from the carried-forward base at once, and the resync runs anyway
        assert read.took is not None
        assert read.took < 0.2, read.took
        assert isinstance(read.value, datetime)
        assert read.value > T0
        assert _eventually(lambda: reads[0] == 2)
    finally:
        answer.set()


def _eventually(check: Callable[[], bool], within_s: float = 2.0) -> bool:
    ends = time.monotonic() + within_s
    while time.monotonic() < ends:
        if check():
            return True
        time.sleep(0.005)
    return check()


def test_a_server_clock_set_back_is_followed_so_engines_started_before_and_after_agree() -> None:
    # Given an engine whose clock was synced with a server 5 minutes fast
    server = [T0 + timedelta(minutes=5)]
    before = DatabaseClock(lambda: server[0], resync_s=0.02)
    before()
    # When the server's clock is corrected (set back 5 minutes) and another engine starts
    server[0] = T0
    after = DatabaseClock(lambda: server[0], resync_s=0.02)
    time.sleep(0.03)
    before()
    # Then, once the first engine resynced, both read the server's time: the first had stayed
    # 5 minutes ahead for good, expiring 3-minute sessions at once that the other said lived
    assert _eventually(lambda: abs((before() - after()).total_seconds()) < 1.0)


def test_a_reading_behind_by_no_more_than_its_uncertainty_does_not_step_the_clock_back() -> None:
    # Given a clock carried forward from a server reading
    clock = DatabaseClock(lambda: T0, resync_s=0.02)
    reads: list[datetime] = []

    def jittery() -> datetime:  # a few milliseconds behind what the clock carried forward
        reads.append(clock() - timedelta(milliseconds=5))
        return reads[-1]

    clock._read = jittery
    # When a resync reads it
    readings = []
    ends = time.monotonic() + 0.1
    while time.monotonic() < ends:
        readings.append(clock())
        time.sleep(0.001)
    # Then the clock never stepped back
    assert reads, "no resync ran"
    assert all(a <= b for a, b in pairwise(readings))
