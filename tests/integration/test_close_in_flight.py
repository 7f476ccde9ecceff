"""An engine closed while other threads are inside its calls: each of them ends at once with
EngineClosed, as a call made after ``close`` does, rather than waiting out its deadline."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from eventsourcing.persistence import OperationalError
from psycopg_pool import ConnectionPool, PoolClosed

from flowledger.domain import EngineClosed, FlowledgerError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.postgres.deadlines import call_within_deadline


def test_a_read_whose_pool_was_closed_meanwhile_is_not_tried_again_until_its_deadline() -> None:
    # (A read in flight when its engine closed was tried again on the closed pool until the
    # operation deadline: get_session hung 15 s before the engine's EngineClosed.)
    # Given a closed pool and a read that fails as a read on it does
    pool: ConnectionPool = ConnectionPool("postgresql://nowhere", open=False)
    calls = 0

    def read() -> None:
        nonlocal calls
        calls += 1
        raise OperationalError("the pool 'pool-1' is already closed")

    # When the read is run within a 5 s deadline
    started = time.monotonic()
    with pytest.raises(OperationalError):
        call_within_deadline(read, budget_s=5.0, pool=pool)
    # Then it is given up at once: the caller says the engine is closed
    assert calls == 1
    assert time.monotonic() - started < 0.5


def test_threads_inside_an_engines_calls_when_it_closes_end_with_engine_closed(pg_engine: Engine) -> None:
    # Given eight threads recording and reading steps on sessions of their own
    for n in range(8):
        pg_engine.start_session(f"s-{n}", "wf")
    ended: Counter[str] = Counter()

    def work(n: int) -> None:
        try:
            for step in range(100_000):
                pg_engine.record_step(f"s-{n}", f"step-{step}")
                pg_engine.get_session(f"s-{n}")
                pg_engine.session_steps(f"s-{n}")
                pg_engine.history(f"s-{n}")
                pg_engine.list_tasks()
        except FlowledgerError as error:
            ended[type(error).__name__] += 1

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    # When the engine is closed under them
    pg_engine.close()
    closed_at = time.monotonic()
    for thread in threads:
        thread.join(timeout=max(0.0, closed_at + 3.0 - time.monotonic()))
    # Then every thread ended within moments, each with EngineClosed
    assert not any(thread.is_alive() for thread in threads), ended
    assert ended == Counter({EngineClosed.__name__: 8})


def test_a_read_that_meets_a_closed_pool_is_engine_closed_at_once() -> None:
    # (The task index's, the log's and erasure's reads tried a closed pool again until the
    # deadline, then said StoreUnavailable: list_tasks during close hung 15 s.)
    calls = 0

    def read() -> None:
        nonlocal calls
        calls += 1
        try:
            raise PoolClosed("the pool 'pool-1' is already closed")
        except PoolClosed as closed:
            raise OperationalError(str(closed)) from closed

    started = time.monotonic()
    with pytest.raises(EngineClosed):
        within_deadline("read the task index", 5.0, read)
    assert calls == 1
    assert time.monotonic() - started < 0.5
