"""The gap problem: readers of the log never pass an id whose transaction commits later.

Writers append concurrently (no table lock), some of them taking low notification ids
and then sleeping before they commit, while followers tail the log. Every follower must
see every event exactly once, in id order, each stream's versions in order.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg.conninfo import conninfo_to_dict

from flowledger.infrastructure.postgres.database import create_schema
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from tests.support.partitions import both_layouts

pytestmark = pytest.mark.postgres
pytest_generate_tests = both_layouts  # each test on the one-table and the 4-partition log


def make_datastore(database_url: str, schema: str, *, db_functions: bool = False) -> PostgresDatastore:
    """A library datastore on the test server, in ``schema``."""
    create_schema(database_url, schema)
    params = conninfo_to_dict(database_url)
    return PostgresDatastore(
        dbname=str(params.get("dbname") or "postgres"),
        host=str(params.get("host") or "localhost"),
        port=str(params.get("port") or "5432"),
        user=str(params.get("user") or "postgres"),
        password=str(params.get("password") or ""),
        schema=schema,
        pool_size=4,
        max_overflow=16,
        enable_db_functions=db_functions,
    )


@pytest.fixture
def datastore(database_url: str, pg_schema: str) -> Iterator[PostgresDatastore]:
    store = make_datastore(database_url, pg_schema)
    yield store
    store.close()


@pytest.fixture
def recorder(datastore: PostgresDatastore) -> FlowledgerApplicationRecorder:
    rec = FlowledgerApplicationRecorder(datastore, events_table_name="flowledger_events")
    rec.create_table()
    return rec


def event(stream: uuid.UUID, version: int) -> StoredEvent:
    return StoredEvent(originator_id=stream, originator_version=version, topic="t:E", state=b"{}")


def append_uncommitted(recorder: PostgresApplicationRecorder, events: list[StoredEvent]) -> Any:
    """Open a transaction that has appended ``events`` (so holds their ids) but not committed.

    Returns the pool's connection context; leave it to commit, or raise into it to roll back.
    """
    ctx = recorder.datastore.get_connection()
    conn = ctx.__enter__()
    conn.execute("BEGIN")
    if isinstance(recorder, FlowledgerApplicationRecorder):
        recorder.append(conn.cursor(), events)
    else:
        rows = [
            recorder.construct_pg_stored_event(e.originator_id, e.originator_version, e.topic, e.state)
            for e in events
        ]
        conn.execute(recorder.sql_invoke_pg_function_insert_events, (rows,))
    return ctx, conn


def highest_committed_id(recorder: PostgresApplicationRecorder) -> int:
    """The highest notification id any committed row has, ignoring the horizon."""
    with recorder.datastore.get_connection() as conn:
        row = conn.execute(
            f"SELECT max(notification_id) AS m FROM {recorder.datastore.schema}.{recorder.events_table_name}"
        ).fetchone()
    return int(row["m"] or 0) if row else 0


def test_a_reader_does_not_pass_an_id_whose_transaction_is_still_open(
    recorder: FlowledgerApplicationRecorder,
) -> None:
    # Given a transaction that took notification id 1 and has not committed
    recorder.horizon_wait = 0.2
    slow, fast = uuid.uuid4(), uuid.uuid4()
    ctx, conn = append_uncommitted(recorder, [event(slow, 1)])
    try:
        # And a later append that committed with id 2
        assert recorder.insert_events([event(fast, 1)]) == [2]

        # When a reader reads the log, then it stops before id 1: id 2 is held back
        assert recorder.select_notifications(start=None, limit=10) == []
        assert recorder.max_notification_id() is None
        conn.execute("COMMIT")
    finally:
        ctx.__exit__(None, None, None)

    # When the slow transaction commits, both are readable, in id order
    seen = recorder.select_notifications(start=None, limit=10)
    assert [(n.id, n.originator_id) for n in seen] == [(1, slow), (2, fast)]
    assert recorder.max_notification_id() == 2


def test_the_library_db_function_path_would_have_skipped_the_late_commit(
    database_url: str, pg_schema: str
) -> None:
    # Given the stock recorder's DB-function insert (no table lock), as flowledger used before
    store = make_datastore(database_url, pg_schema, db_functions=True)
    try:
        stock = PostgresApplicationRecorder(store, events_table_name="stock_events")
        stock.create_table()
        ctx, conn = append_uncommitted(stock, [event(uuid.uuid4(), 1)])
        try:
            stock.insert_events([event(uuid.uuid4(), 1)])
            # When a follower reads now, it sees id 2 and moves its position past id 1
            position = stock.select_notifications(start=None, limit=10)[-1].id
            conn.execute("COMMIT")
        finally:
            ctx.__exit__(None, None, None)
        # Then id 1, committed late, is never read by that follower: the gap problem
        later = stock.select_notifications(start=position, limit=10, inclusive_of_start=False)
        assert position == 2
        assert later == []
    finally:
        store.close()


def write_streams(
    recorder: FlowledgerApplicationRecorder,
    streams: list[uuid.UUID],
    saves: int,
    seed: int,
    errors: list[BaseException],
    overtaken: list[int],
) -> None:
    """Append ``saves`` events to each stream; about one save in four holds its ids, then sleeps."""
    rng = random.Random(seed)
    try:
        for version in range(1, saves + 1):
            for stream in streams:
                batch = [event(stream, version)]
                if rng.random() < 0.25:
                    ctx, conn = append_uncommitted(recorder, batch)
                    try:
                        own = conn.execute(
                            "SELECT max(notification_id) AS m FROM "
                            f"{recorder.datastore.schema}.{recorder.events_table_name} "
                            "WHERE originator_id = %s",
                            (stream,),
                        ).fetchone()
                        time.sleep(rng.uniform(0.005, 0.05))
                        if own is not None and highest_committed_id(recorder) > own["m"]:
                            overtaken.append(own["m"])
                        conn.execute("COMMIT")
                    finally:
                        ctx.__exit__(None, None, None)
                else:
                    recorder.insert_events(batch)
    except BaseException as exc:
        errors.append(exc)


def tail(
    recorder: FlowledgerApplicationRecorder,
    expected: int,
    seen: list[Notification],
    errors: list[BaseException],
) -> None:
    """Follow the log by position, as a projection does, until ``expected`` events are read."""
    position = 0
    deadline = time.monotonic() + 60
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            page = recorder.select_notifications(start=position, limit=7, inclusive_of_start=False)
            seen.extend(page)
            if page:
                position = page[-1].id
            else:
                time.sleep(0.002)
    except BaseException as exc:
        errors.append(exc)


def assert_exactly_once_in_order(seen: list[Notification], expected: set[tuple[uuid.UUID, int]]) -> None:
    keys = [(n.originator_id, n.originator_version) for n in seen]
    assert len(keys) == len(set(keys)), "an event was read twice"
    assert set(keys) == expected, f"missing {len(expected - set(keys))} events"
    ids = [n.id for n in seen]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids))
    last_version: dict[Any, int] = {}
    for n in seen:
        assert n.originator_version == last_version.get(n.originator_id, 0) + 1
        last_version[n.originator_id] = n.originator_version


def test_followers_see_every_event_once_in_order_while_writers_commit_late(
    recorder: FlowledgerApplicationRecorder,
) -> None:
    # Given 8 writers, two streams each, 25 saves per stream, a quarter of them committed late
    writers, saves = 8, 25
    streams = [[uuid.uuid4(), uuid.uuid4()] for _ in range(writers)]
    expected = {(s, v) for pair in streams for s in pair for v in range(1, saves + 1)}
    errors: list[BaseException] = []
    overtaken: list[int] = []
    polled: list[Notification] = []
    live: list[Notification] = []

    def follow_live() -> None:
        try:
            with recorder.subscribe(gt=0) as subscription:
                for notification in subscription:
                    live.append(notification)
                    if len(live) == len(expected):
                        break
        except BaseException as exc:
            errors.append(exc)

    # When they write while a polling follower and a live subscription tail the log
    threads = [
        threading.Thread(target=tail, args=(recorder, len(expected), polled, errors)),
        threading.Thread(target=follow_live),
    ]
    threads += [
        threading.Thread(target=write_streams, args=(recorder, pair, saves, i, errors, overtaken))
        for i, pair in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    # Then both followers saw every event exactly once, in id and version order
    assert not errors, errors
    assert_exactly_once_in_order(polled, expected)
    assert_exactly_once_in_order(live, expected)
    # And late commits really happened: ids committed after a higher id had committed
    assert len(overtaken) > 10, overtaken
