"""New pooled connections run the stream reads once (``stream_reads.py``): a fresh engine's
first load finds its statements prepared; a connection the pool makes later is warmed too;
behind PgBouncer nothing is prepared; a missing table or a refused read only skips."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.deadlines import ReconnectingPool
from flowledger.infrastructure.postgres.stream_reads import NIL, stream_query, warm_up
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


def pool_of(engine: Engine) -> ReconnectingPool:
    pool = engine.log.recorder.datastore.pool
    assert isinstance(pool, ReconnectingPool)
    return pool


@contextmanager
def every_idle(pool: ReconnectingPool) -> Iterator[list[Any]]:
    """All the pool's idle connections at once (so none is handed out twice)."""
    pool.wait(timeout=10)
    taken = [pool.getconn(timeout=5) for _ in range(pool.get_stats()["pool_available"])]
    try:
        yield taken
    finally:
        for conn in taken:
            pool.putconn(conn)


def prepared_reads(conn: Any, schema: str) -> dict[str, int]:
    """The prepared statements reading this schema's tables by stream, with their run counts."""
    rows = conn.execute(
        "SELECT statement, generic_plans + custom_plans AS runs FROM pg_prepared_statements "
        "WHERE statement LIKE %s AND statement LIKE %s",
        (f'%"{schema}".%', "%WHERE originator_id = $1%"),
    ).fetchall()
    return {r["statement"]: int(r["runs"]) for r in rows}


def test_a_fresh_engine_s_connections_have_the_event_and_snapshot_reads_prepared(
    database_url: str, pg_schema: str
) -> None:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=3))
    try:
        with every_idle(pool_of(engine)) as conns:
            assert conns
            for conn in conns:
                statements = prepared_reads(conn, pg_schema)
                events_table = engine.log.recorder.events_table_name
                assert sum(f'"{events_table}"' in s for s in statements) == 2  # all, and after a snapshot
                assert sum("snapshots" in s and "DESC" in s and "LIMIT" in s for s in statements) == 1
    finally:
        engine.close()


def test_a_load_runs_the_warmed_statements_not_new_ones(database_url: str, pg_schema: str) -> None:
    writer = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        writer.start_session("warm", "customer_service")
        for n in range(60):  # past the snapshot interval (50): a snapshot and events after it
            writer.record_step("warm", f"s{n}", input={}, output={})
    finally:
        writer.close()
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=2))
    try:
        pool = pool_of(engine)
        with every_idle(pool) as conns:
            before = {id(c): prepared_reads(c, pg_schema) for c in conns}
        assert engine.get_session("warm").step_count == 60
        with every_idle(pool) as conns:
            after = {id(c): prepared_reads(c, pg_schema) for c in conns}
        # The same statements, nothing prepared anew, and two of them ran once more in all.
        assert {k: set(v) for k, v in after.items()} == {k: set(v) for k, v in before.items()}
        runs = sum(sum(v.values()) for v in after.values()) - sum(sum(v.values()) for v in before.values())
        assert runs == 2
    finally:
        engine.close()


def test_a_connection_the_pool_makes_later_is_warmed_too(database_url: str, pg_schema: str) -> None:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=2))
    try:
        pool = pool_of(engine)
        with every_idle(pool) as conns:
            replaced = {conn.info.backend_pid for conn in conns}
            for conn in conns:
                conn.close()  # given back closed: the pool makes new ones
        with every_idle(pool) as conns:
            assert conns
            assert not replaced & {conn.info.backend_pid for conn in conns}
            for conn in conns:
                assert len(prepared_reads(conn, pg_schema)) == 3
    finally:
        engine.close()


def test_behind_pgbouncer_nothing_is_prepared(database_url: str, pg_schema: str) -> None:
    engine = Engine(
        settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=2, pgbouncer=True)
    )
    try:
        pool = pool_of(engine)
        assert pool.warm_reads is None
        engine.start_session("s", "customer_service")
        assert engine.get_session("s").step_count == 0
        with every_idle(pool) as conns:
            for conn in conns:
                assert conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()["n"] == 0
    finally:
        engine.close()


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_read_that_fails_is_skipped_and_the_connection_stays_usable(
    database_url: str, pg_schema: str, autocommit: bool
) -> None:
    missing = psycopg.sql.SQL("SELECT * FROM {}.no_such_table WHERE originator_id = %s").format(
        psycopg.sql.Identifier(pg_schema)
    )
    present = psycopg.sql.SQL("SELECT 1 AS one WHERE %s::uuid IS NOT NULL")
    with psycopg.connect(database_url, autocommit=autocommit) as conn:
        warm_up(conn, [stream_query(missing, NIL), (present, [NIL])])
        assert conn.execute("SELECT 2").fetchone() == (2,)
        names = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
        # Outside autocommit nothing is run (psycopg forgets prepared statements at a rollback).
        assert any("SELECT 1 AS one" in s for s in names) is autocommit


def test_a_connection_lost_during_the_warm_up_raises(database_url: str) -> None:
    conn = psycopg.connect(database_url, autocommit=True)
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        warm_up(conn, [(psycopg.sql.SQL("SELECT %s::uuid"), [NIL])])
