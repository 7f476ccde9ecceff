"""The log's own invariants at start-up and on failure: a cached id sequence, a failed id section."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from flowledger.domain.errors import FlowledgerError
from flowledger.infrastructure import Engine
from tests.faults.ledger import Marker, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
SEQUENCE = "SELECT pg_get_serial_sequence('faults.flowledger_events', 'notification_id')"


def sequence_name(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(SEQUENCE).fetchone()
    assert row is not None
    assert row[0], "the events table has no notification-id sequence"
    return str(row[0])


def execute(url: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description else []


def record(engine: Engine, session: str, n: int, acknowledged: list[Marker]) -> None:
    engine.record_step(session, "answer", input={"s": session, "n": str(n)})
    acknowledged.append((session, str(n)))


def test_e_a_cached_notification_sequence_is_forced_to_cache_1_or_refused(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given a log whose notification-id sequence was given a cache of 10
    server = private_postgres()
    with Engine(settings=fault_settings(server.url)) as first:
        first.start_session("cache-0", "customer_service")
    sequence = sequence_name(server.url)
    execute(server.url, f"ALTER SEQUENCE {sequence} CACHE 10")

    # When engines start on it
    try:
        writers = [Engine(settings=fault_settings(server.url)) for _ in range(2)]
    except FlowledgerError as error:
        refusal = str(error)
    else:
        refusal = ""
    if refusal:
        report(f"refused to start: {refusal}")
        assert "cache" in refusal.lower(), "the refusal does not say what is wrong"
        return

    # Then the cache is back to 1, and two writers lose and double nothing
    acknowledged: list[Marker] = []
    try:
        for index, engine in enumerate(writers):
            engine.start_session(f"cache-{index + 1}", "customer_service")
        for n in range(20):
            for index, engine in enumerate(writers):
                record(engine, f"cache-{index + 1}", n, acknowledged)
    finally:
        for engine in writers:
            engine.close()
    (cache_size,) = execute(
        server.url,
        "SELECT cache_size FROM pg_sequences WHERE schemaname = 'faults' "
        "AND sequencename = 'flowledger_events_notification_id_seq'",
    )[0]
    result = tally(server.url, "faults", acknowledged)
    report(f"{result.line()} cache_size={cache_size}")
    assert cache_size == 1
    assert result.lost == 0
    assert result.doubled == 0


def test_g_a_failure_inside_the_append_id_section_blocks_no_later_writer(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given two engines with warm pools on one log
    server = private_postgres()
    acknowledged: list[Marker] = []
    first = Engine(settings=fault_settings(server.url))
    second = Engine(settings=fault_settings(server.url))
    try:
        first.start_session("section-1", "customer_service")
        second.start_session("section-2", "customer_service")
        for n in range(3):
            record(first, "section-1", n, acknowledged)
            record(second, "section-2", n, acknowledged)

        # When nextval fails inside the id section (the sequence is at its maximum)
        sequence = sequence_name(server.url)
        execute(server.url, f"SELECT setval('{sequence}', last_value) FROM {sequence}")
        execute(
            server.url,
            f"DO $$ BEGIN EXECUTE format('ALTER SEQUENCE {sequence} MAXVALUE %s', "
            f"(SELECT last_value FROM {sequence})); END $$",
        )
        started = time.monotonic()
        with pytest.raises(Exception) as failed:  # noqa: PT011 - any error: the append must fail
            record(first, "section-1", 100, acknowledged)
        failed_after = time.monotonic() - started
        held = execute(server.url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        execute(server.url, f"ALTER SEQUENCE {sequence} NO MAXVALUE")

        # Then the next writers, on either engine, are not blocked
        timings = []
        for n in range(101, 104):
            for engine, session in ((second, "section-2"), (first, "section-1")):
                started = time.monotonic()
                record(engine, session, n, acknowledged)
                timings.append(time.monotonic() - started)
    finally:
        first.close()
        second.close()
    result = tally(server.url, "faults", acknowledged)
    report(
        f"{result.line()} failed_append_s={failed_after:.2f} advisory_locks_held_after={held[0][0]} "
        f"slowest_next_write_s={max(timings):.3f} failure={type(failed.value).__name__}: "
        f"{str(failed.value)[:80]!r}"
    )
    assert held[0][0] == 0, "a pooled connection still holds the append's advisory lock"
    assert max(timings) < 1.0
    assert result.lost == 0
    assert result.doubled == 0


def test_e_a_cache_set_while_engines_write_loses_no_event_for_a_follower(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given two engines writing and a follower reading the log in id order, as projections do
    server = private_postgres()
    settings = fault_settings(server.url)
    writers = [Engine(settings=settings) for _ in range(2)]
    follower = Engine(settings=settings)
    acknowledged: list[Marker] = []
    refusals: Counter[str] = Counter()
    delivered: list[int] = []
    stop = threading.Event()

    def write(engine: Engine, session: str) -> None:
        n = 0
        while not stop.is_set():
            try:
                record(engine, session, n, acknowledged)
            except FlowledgerError as error:  # refused: counted, the writer goes on
                refusals[type(error).__name__] += 1
            n += 1

    def follow() -> None:
        last = 0
        while True:
            page = list(follower.log.notifications(after=last))
            delivered.extend(n.id for n in page)
            last = delivered[-1] if delivered else 0
            if stop.is_set() and not page:
                return
            time.sleep(0.005)

    try:
        for index, engine in enumerate(writers):
            engine.start_session(f"live-{index}", "customer_service")
        threads = [
            threading.Thread(target=write, args=(engine, f"live-{index}"), daemon=True)
            for index, engine in enumerate(writers)
        ]
        threads.append(threading.Thread(target=follow, daemon=True))
        for thread in threads:
            thread.start()
        time.sleep(0.3)

        # When an operator gives the sequence a cache of 10 while they run
        execute(server.url, f"ALTER SEQUENCE {sequence_name(server.url)} CACHE 10")
        time.sleep(1.2)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads), "a writer or the follower hung"
    finally:
        stop.set()
        for engine in (*writers, follower):
            engine.close()

    # Then the follower delivered every stored event once, in id order, skipping none
    stored = [
        int(str(row[0]))
        for row in execute(server.url, "SELECT notification_id FROM faults.flowledger_events ORDER BY 1")
    ]
    (cache_size,) = execute(
        server.url,
        "SELECT cache_size FROM pg_sequences WHERE schemaname = 'faults' "
        "AND sequencename = 'flowledger_events_notification_id_seq'",
    )[0]
    result = tally(server.url, "faults", acknowledged)
    skipped = sorted(set(stored) - set(delivered))
    report(
        f"{result.line()} delivered={len(delivered)} stored_events={len(stored)} skipped={len(skipped)} "
        f"refused={dict(refusals)} cache_size={cache_size}"
    )
    assert skipped == [], f"the follower never delivered {len(skipped)} stored ids, first {skipped[:5]}"
    assert delivered == stored
    assert result.lost == 0
    assert result.doubled == 0
    assert result.acknowledged > 40, "the writers did not go on after the cache was set"
