"""Concurrent appends on flowledger's event log: no table lock, yet every guarantee kept."""

from __future__ import annotations

import gc
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.infrastructure.postgres.sql import XID_ALREADY_ASSIGNED, section_lock_key
from tests.conftest import make_settings
from tests.integration.test_recorder_gaps import append_uncommitted, make_datastore

pytestmark = pytest.mark.postgres


def event(stream: Any, version: int) -> StoredEvent:
    return StoredEvent(originator_id=stream, originator_version=version, topic="t:E", state=b"{}")


@pytest.fixture
def recorder(database_url: str, pg_schema: str) -> Any:
    store = make_datastore(database_url, pg_schema)
    rec = FlowledgerApplicationRecorder(store, events_table_name="flowledger_events")
    rec.create_table()
    yield rec
    store.close()


def test_an_append_does_not_wait_for_another_appends_commit(recorder: FlowledgerApplicationRecorder) -> None:
    # Given an append whose transaction is still open
    ctx, conn = append_uncommitted(recorder, [event(uuid.uuid4(), 1)])
    try:
        # When another writer appends, then it commits without waiting (no table lock)
        done = threading.Event()

        def append() -> None:
            recorder.insert_events([event(uuid.uuid4(), 1)])
            done.set()

        worker = threading.Thread(target=append)
        worker.start()
        assert done.wait(timeout=5), "the second append waited for the first one's commit"
        worker.join()
        conn.execute("COMMIT")
    finally:
        ctx.__exit__(None, None, None)
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2]


def test_only_one_of_many_concurrent_saves_of_the_same_version_wins(
    recorder: FlowledgerApplicationRecorder,
) -> None:
    # Given 16 writers racing to append version 1 and 2 of the same stream
    stream = uuid.uuid4()
    barrier = threading.Barrier(16)

    def save(i: int) -> str:
        barrier.wait()
        try:
            recorder.insert_events([event(stream, 1), event(stream, 2)])
        except IntegrityError:
            return "conflict"
        return "saved"

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(save, range(16)))

    # Then exactly one save is stored, whole, and the others were told of the conflict
    assert sorted(outcomes) == ["conflict"] * 15 + ["saved"]
    assert [e.originator_version for e in recorder.select_events(stream)] == [1, 2]
    assert [(n.originator_id, n.originator_version) for n in recorder.select_notifications(None, 10)] == [
        (stream, 1),
        (stream, 2),
    ]


def advisory_locks_held(recorder: FlowledgerApplicationRecorder) -> int:
    key = section_lock_key(recorder.datastore.schema, recorder.events_table_name)
    with recorder.datastore.get_connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s::bigint",
            (key,),
        ).fetchone()
    return int(row["n"]) if row else -1


def test_a_failed_append_leaves_the_id_section_unlocked(recorder: FlowledgerApplicationRecorder) -> None:
    # Given a stream with version 1
    stream = uuid.uuid4()
    recorder.insert_events([event(stream, 1)])

    # (the probe does see the lock when it is held)
    with recorder.datastore.get_connection() as holder:
        holder.execute(
            "SELECT pg_advisory_lock(%s)",
            (section_lock_key(recorder.datastore.schema, recorder.events_table_name),),
        )
        assert advisory_locks_held(recorder) == 1
        holder.execute("SELECT pg_advisory_unlock_all()")

    # When an append conflicts, then it fails and the section lock is not left held
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(stream, 2), event(stream, 1)])
    assert advisory_locks_held(recorder) == 0

    # And the next append goes through
    assert recorder.insert_events([event(stream, 2)]) is not None
    assert [e.originator_version for e in recorder.select_events(stream)] == [1, 2]


def test_the_append_refuses_to_follow_another_write_in_its_transaction(
    recorder: FlowledgerApplicationRecorder,
) -> None:
    # Given a transaction that has already written (so already has its transaction id)
    event = StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t:E", state=b"{}")
    with recorder.datastore.get_connection() as conn:
        conn.execute("BEGIN")
        conn.execute("CREATE TEMP TABLE scratch (x int) ON COMMIT DROP")
        conn.execute("INSERT INTO scratch VALUES (1)")
        # When it appends, then the append refuses: its rows could sort before older ones
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=XID_ALREADY_ASSIGNED):
            recorder.append(conn.cursor(), [event])
        conn.execute("ROLLBACK")
    assert recorder.select_notifications(None, 10) == []


def test_a_table_the_stock_recorder_made_is_upgraded_in_place(database_url: str, pg_schema: str) -> None:
    # Given events written by the library's stock recorder
    store = make_datastore(database_url, pg_schema)
    try:
        stock = PostgresApplicationRecorder(store, events_table_name="flowledger_events")
        stock.create_table()
        old = uuid.uuid4()
        stock.insert_events([event(old, 1), event(old, 2)])

        # When flowledger's recorder opens the same table
        ours = FlowledgerApplicationRecorder(store, events_table_name="flowledger_events")
        ours.create_table()

        # Then the old events are readable, new ids continue after them
        assert ours.insert_events([event(old, 3)]) == [3]
        assert [n.originator_version for n in ours.select_notifications(None, 10)] == [1, 2, 3]
        # And a stock writer still running against it fails loudly rather than mis-ordering
        with pytest.raises(PersistenceError):
            stock.insert_events([event(old, 4)])
    finally:
        store.close()


def test_the_engine_appends_through_flowledgers_recorder(pg_engine: Engine) -> None:
    assert type(pg_engine.log.recorder) is FlowledgerApplicationRecorder


def test_eight_engine_writers_each_on_a_session_lose_no_step(database_url: str, pg_schema: str) -> None:
    # Given an engine and 8 sessions
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        for i in range(8):
            engine.start_session(f"s{i}", "cs")

        # When 8 threads record 20 steps each, one session per thread
        def steps(i: int) -> None:
            for n in range(20):
                engine.record_step(f"s{i}", f"step-{n}")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(steps, range(8)))

        # Then the log holds all 168 events, readable in id order with versions in order
        log = engine.log.recorder.select_notifications(None, 1000)
        assert len(log) == 8 + 8 * 20
        versions: dict[Any, int] = {}
        for n in log:
            assert n.originator_version == versions.get(n.originator_id, 0) + 1
            versions[n.originator_id] = n.originator_version
    finally:
        engine.close()


def test_closing_the_datastore_right_after_an_append_ends_the_notifier_quietly(
    database_url: str, pg_schema: str
) -> None:
    # Given a recorder whose datastore is closed right after an append (its NOTIFY pending)
    store: PostgresDatastore = make_datastore(database_url, pg_schema)
    rec = FlowledgerApplicationRecorder(store, events_table_name="flowledger_events")
    rec.create_table()
    rec.insert_events([event(uuid.uuid4(), 1)])
    store.close()
    # Then the notifier thread ends without an unhandled exception (pytest would report it)
    thread = rec.notifier._thread
    if thread is not None:
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_closing_the_engine_stops_the_notifier(database_url: str, pg_schema: str) -> None:
    # Given an engine whose notifier runs after an append, on a connection of its own
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    engine.start_session("s-notify", "wf")
    notifier = engine.log.recorder.notifier  # type: ignore[attr-defined]
    thread = notifier._thread
    assert thread is not None
    assert thread.is_alive()
    # When the engine closes
    engine.close()
    # Then the notifier thread has ended already, and a later append would not restart it
    assert not thread.is_alive()
    notifier.poke()
    assert notifier._thread is None


def test_the_notifier_does_not_take_a_writer_connection(database_url: str, pg_schema: str) -> None:
    # Given an engine whose pool has room for exactly two connections, and a listener
    settings = make_settings(database_url=database_url, schema=pg_schema, pool_size=2)
    with Engine(settings=settings) as engine, psycopg.connect(database_url, autocommit=True) as listener:
        recorder: Any = engine.log.recorder
        listener.execute(f'LISTEN "{recorder.channel_name}"')
        pool = recorder.datastore.pool
        held = [pool.getconn(timeout=5), pool.getconn(timeout=5)]
        try:
            # When an append commits while both pooled connections are held by callers
            held[0].execute(recorder.sql_append_one, (uuid.uuid4(), 1, "t:E", b"{}", None, None))
            recorder.notifier.poke()
            # Then the NOTIFY still goes out (the notifier has a connection of its own);
            # psycopg may hand over more than one if several arrive in one packet
            heard = list(listener.notifies(timeout=5, stop_after=1))
            assert heard
            assert {n.channel for n in heard} == {recorder.channel_name}
        finally:
            for conn in held:
                pool.putconn(conn)


def test_a_connection_the_pool_drops_is_freed_with_its_append_cursor(
    recorder: FlowledgerApplicationRecorder,
) -> None:
    # Given an append that left its cursor on the pooled connection it used
    recorder.insert_events([event(uuid.uuid4(), 1)])
    pool = recorder.datastore.pool
    conns = [pool.getconn(timeout=5) for _ in range(pool.get_stats()["pool_size"])]
    used = [c for c in conns if getattr(c, "_flowledger_append_cursor", None) is not None]
    assert len(used) == 1
    dropped = weakref.ref(used[0])
    for conn in conns:
        pool.putconn(conn)
    del conns, used, conn
    # When the pool replaces its connections
    pool.drain()
    gc.collect()
    # Then the old connection is gone (the cursor did not keep it alive), and appends go on
    assert dropped() is None
    assert recorder.insert_events([event(uuid.uuid4(), 1)])


def test_every_burst_of_appends_is_heard_even_across_the_notifiers_idle_exit(
    recorder: FlowledgerApplicationRecorder, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a recorder whose notifier goes idle after 50 ms (its only sender of NOTIFY), and a listener
    import flowledger.infrastructure.postgres.notify as notify

    monkeypatch.setattr(notify, "IDLE_EXIT_SECONDS", 0.05)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{recorder.channel_name}"')
        for burst in range(5):
            # When eight threads append at once (each append pokes the notifier)
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda _: recorder.insert_events([event(uuid.uuid4(), 1)]), range(32)))
            # Then a NOTIFY follows the burst, whether the notifier thread was running or
            # had gone idle in between (after every other burst it is waited out)
            heard = list(listener.notifies(timeout=5, stop_after=1))
            assert heard, burst
            assert {n.channel for n in heard} == {recorder.channel_name}
            if burst % 2:
                thread = recorder.notifier._thread
                if thread is not None:
                    thread.join(timeout=5)
                assert recorder.notifier._thread is None
            list(listener.notifies(timeout=0.2))  # the rest of this burst's, before the next


def test_closing_the_notifier_right_after_a_notify_does_not_wait_out_its_interval(
    recorder: FlowledgerApplicationRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a notifier that waits a whole second between NOTIFYs, and has just sent one
    import flowledger.infrastructure.postgres.notify as notify

    monkeypatch.setattr(notify, "MIN_INTERVAL_SECONDS", 1.0)
    recorder.insert_events([event(uuid.uuid4(), 1)])
    deadline = time.monotonic() + 5
    while recorder.notifier._pending.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)  # the thread took the poke: it is sending, then waiting its interval
    assert recorder.notifier._thread is not None
    # When it is closed
    started = time.monotonic()
    recorder.notifier.close()
    # Then it stops at once (it had slept out the interval: every engine's close took up
    # to 20 ms, the default interval, after its last append), and its thread is gone
    assert time.monotonic() - started < 0.5
    assert recorder.notifier._thread is None
