"""Analytics from a streaming replica (``FLOWLEDGER_READ_DATABASE_URL``).

A primary and a hot standby copied from it with ``pg_basebackup -R`` (private clusters on
loopback, temporary directories). Writes and the follower go to the primary; the dashboards,
the funnel and the dashboard page read the standby and show the data once it is replayed;
the follower's read models equal a rebuild. And the gap-safe read of the log works on the
standby (its horizon is the snapshot's xmin there), but any transaction open on the
primary's cluster holds it back: why the follower reads the log from the primary.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresDatastore
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import create_schema
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.projections import projector_for
from flowledger.projections.follow import follow
from flowledger.projections.processor import Projector
from flowledger.projections.rebuild import verify
from tests.conftest import make_settings
from tests.faults.server import PrivateServer, new_root, wait_replayed

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PrivateServer, PrivateServer]]:
    """A running primary and a hot standby streaming from it."""
    primary = PrivateServer(new_root())
    standby: PrivateServer | None = None
    try:
        primary.start()
        standby = PrivateServer(new_root(), standby_of=primary)
        standby.start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.cleanup()
        primary.cleanup()


def usage(cost: str) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model="gpt-4.1",
        response_model="gpt-4.1",
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal(cost),
        latency_ms=20.0,
    )


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def followed_to_head(projector: Projector) -> bool:
    """Every live build of the primary is at the head of the log."""
    head = projector.recorder.max_notification_id() or 0
    with projector.connect() as conn:
        rows = conn.execute(
            f'SELECT b.position FROM "{projector.names.control}".builds b '
            f'JOIN "{projector.names.control}".active a ON a.schema_name = b.schema_name'
        ).fetchall()
    return bool(rows) and all(int(position) >= head for (position,) in rows)


def calls(client: TestClient) -> int:
    rows = client.get("/v1/dashboard", params={"by": "model"}).json()
    return sum(int(row["calls"]) for row in rows)


def reached(client: TestClient, step: str) -> int:
    reports = client.get("/v1/funnel/cs").json()
    return sum(int(s["reached"]) for r in reports for s in r["steps"] if s["step"] == step)


def test_dashboards_read_the_standby_while_the_follower_writes_the_primary(
    pair: tuple[PrivateServer, PrivateServer], tmp_path: Path, report: Callable[[str], None]
) -> None:
    primary, standby = pair
    settings = make_settings(database_url=primary.url, read_database_url=standby.url, schema="replica_a")
    stop, ready = threading.Event(), threading.Event()
    with Engine(settings=settings) as engine:
        projector = projector_for(engine)
        follower = threading.Thread(target=follow, args=(projector,), kwargs={"stop": stop, "ready": ready})
        follower.start()
        try:
            assert ready.wait(20)
            # Given sessions written through the engine (to the primary) and followed there
            for n in range(3):
                engine.start_session(f"s-{n}", "cs")
                engine.record_step(f"s-{n}", "greet", usage=usage("0.0010"))
            wait_until(lambda: followed_to_head(projector), "the follower reached the head")
            lags = [wait_replayed(primary.url, standby.url)]
            with TestClient(create_app(engine, require_keys=False)) as client:
                # Then the dashboards read them from the standby
                assert calls(client) == 3
                assert reached(client, "greet") == 3
                # When the standby stops replaying and more is written and followed
                with psycopg.connect(standby.url, autocommit=True) as conn:
                    conn.execute("SELECT pg_wal_replay_pause()")
                try:
                    for n in range(3):
                        engine.record_step(f"s-{n}", "answer", usage=usage("0.0020"))
                    engine.start_session("s-3", "cs")
                    engine.record_step("s-3", "greet", usage=usage("0.0010"))
                    wait_until(lambda: followed_to_head(projector), "the follower reached the head")
                    # Then the primary's read models have it, the dashboards (reading the
                    # standby, and not catching up themselves) do not yet
                    with projector.connect() as conn:
                        primary_calls = conn.execute(
                            f'SELECT count(*) FROM "{projector.names.reader}".llm_calls'
                        ).fetchone()
                    assert primary_calls == (7,)
                    assert calls(client) == 3
                    assert reached(client, "answer") == 0
                    assert client.get("/dashboard").status_code == 200
                finally:
                    with psycopg.connect(standby.url, autocommit=True) as conn:
                        conn.execute("SELECT pg_wal_replay_resume()")
                # And once it has replayed, they show it
                lags.append(wait_replayed(primary.url, standby.url))
                assert calls(client) == 7
                assert reached(client, "answer") == 3
                assert reached(client, "greet") == 4
                page = client.get("/dashboard")
                assert page.status_code == 200
                assert "gpt-4.1" in page.text
            # The writes went to the primary: the standby is in recovery (it refuses writes)
            # and holds the same log once replayed
            count = f'SELECT count(*) FROM "{settings.schema}".flowledger_events'
            with psycopg.connect(standby.url) as s_conn, psycopg.connect(primary.url) as p_conn:
                assert s_conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
                assert s_conn.execute(count).fetchone() == p_conn.execute(count).fetchone()
        finally:
            stop.set()
            follower.join(timeout=20)
        # The follower's read models equal a rebuild from the log
        assert verify(projector) == []
    report(f"replay waits after the follower caught up: {', '.join(f'{lag * 1000:.1f} ms' for lag in lags)}")


def _datastore(url: str, schema: str) -> PostgresDatastore:
    params = psycopg.conninfo.conninfo_to_dict(url)
    return PostgresDatastore(
        dbname=str(params["dbname"]),
        host=str(params["host"]),
        port=str(params["port"]),
        user=str(params["user"]),
        password="",
        schema=schema,
        pool_size=2,
        max_overflow=4,
    )


def _event() -> StoredEvent:
    return StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t:E", state=b"{}")


def _ids(recorder: FlowledgerApplicationRecorder) -> list[int]:
    return [n.id for n in recorder.select_notifications(start=1, limit=100)]


def test_the_log_read_on_the_standby_never_passes_an_append_in_flight_but_waits_for_any_transaction(
    pair: tuple[PrivateServer, PrivateServer], report: Callable[[str], None]
) -> None:
    primary, standby = pair
    create_schema(primary.url, "replica_b")
    on_primary, on_standby = _datastore(primary.url, "replica_b"), _datastore(standby.url, "replica_b")
    try:
        writer = FlowledgerApplicationRecorder(on_primary, events_table_name="flowledger_events")
        writer.create_table()
        reader = FlowledgerApplicationRecorder(on_standby, events_table_name="flowledger_events")
        reader.horizon_wait = 0.2
        writer.insert_events([_event()])
        # Given an append that took id 2 and is still open, and one that took id 3 and committed
        held: Any = on_primary.get_connection()
        conn = held.__enter__()
        conn.execute("BEGIN")
        writer.append(conn.cursor(), [_event()])
        try:
            writer.insert_events([_event()])
            wait_replayed(primary.url, standby.url)
            # Then the standby's reader stops before id 2 (xmax alone would have passed it)
            assert _ids(reader) == [1]
        finally:
            conn.execute("COMMIT")
            held.__exit__(None, None, None)
        wait_replayed(primary.url, standby.url)
        assert _ids(reader) == [1, 2, 3]
        # When a transaction of another database of the primary's cluster holds an id
        with psycopg.connect(primary.url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS other")
            admin.execute("CREATE DATABASE other")
        other_url = primary.url.replace("/postgres?", "/other?")
        with psycopg.connect(other_url) as other:
            other.execute("SELECT pg_current_xact_id()")
            writer.insert_events([_event() for _ in range(5)])
            wait_replayed(primary.url, standby.url)
            # Then the primary's readers take the 5 new events, the standby's none of them
            primary_reader = FlowledgerApplicationRecorder(on_primary, events_table_name="flowledger_events")
            on_primary_now, on_standby_now = len(_ids(primary_reader)) - 3, len(_ids(reader)) - 3
            assert (on_primary_now, on_standby_now) == (5, 0)
            lag = reader.horizon_lag()
            assert lag.held_back == 5
            assert lag.age_s is None
            other.rollback()
        wait_replayed(primary.url, standby.url)
        wait_until(lambda: len(_ids(reader)) == 8, "the standby's reader took the 5 events")
        report(
            "standby horizon: stopped before an append in flight; with a transaction open in "
            f"another database, primary read {on_primary_now}/5 new events, standby {on_standby_now}/5"
        )
    finally:
        on_primary.close()
        on_standby.close()
