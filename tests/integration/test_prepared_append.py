"""The one-event append sent through libpq's prepared call (``prepared_append.py``): the same
rows, ids and errors as the cursor path it replaces, and it survives a deallocated statement
and a lost connection the way psycopg's path does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, OperationalError, StoredEvent

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.prepared_append import PreparedAppend
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=2))
    yield engine
    engine.close()


def event(stream: uuid.UUID, version: int, state: bytes = b'{"n": 1}') -> StoredEvent:
    return StoredEvent(originator_id=stream, originator_version=version, topic="bench:Step", state=state)


def rows(engine: Engine, stream: uuid.UUID) -> list[tuple[int, int, bytes]]:
    """(version, notification id, state) of the stream's stored rows, read with plain SQL."""
    recorder = engine.log.recorder
    with recorder.datastore.get_connection() as conn:
        found = conn.execute(
            f'SELECT originator_version, notification_id, state FROM "{recorder.datastore.schema}".'
            f'"{recorder.events_table_name}" WHERE originator_id = %s ORDER BY originator_version',
            (stream,),
        ).fetchall()
    return [(int(r["originator_version"]), int(r["notification_id"]), bytes(r["state"])) for r in found]


def test_one_event_appends_go_through_the_prepared_call_and_store_what_the_cursor_path_stores(
    engine: Engine,
) -> None:
    recorder: FlowledgerApplicationRecorder = engine.log.recorder
    assert recorder.prepared_one is not None
    stream = uuid.uuid4()
    ids = [recorder.insert_events([event(stream, v, b'{"v": %d}' % v)]) for v in (1, 2, 3)]
    stored = rows(engine, stream)
    assert [(v, n) for v, n, _ in stored] == [(v, i[0]) for v, i in zip((1, 2, 3), ids, strict=True)]
    assert [s for _, _, s in stored] == [b'{"v": 1}', b'{"v": 2}', b'{"v": 3}']
    # The statement was prepared on a pooled connection, under the recorder's name.
    with recorder.datastore.get_connection() as conn:
        prepared = conn.execute("SELECT name FROM pg_prepared_statements").fetchall()
    assert recorder.prepared_one.name.decode() in {r["name"] for r in prepared}
    # Two events at once take the array path; the chain links all of them either way.
    recorder.insert_events([event(stream, 4), event(stream, 5)])
    assert [v for v, _, _ in rows(engine, stream)] == [1, 2, 3, 4, 5]
    engine.audit.checkpoint()
    report = verify_chain(engine.audit)
    assert report.ok, report.findings


def test_a_version_clash_is_the_library_integrity_error_and_stores_nothing(engine: Engine) -> None:
    recorder = engine.log.recorder
    stream = uuid.uuid4()
    recorder.insert_events([event(stream, 1)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(stream, 1, b'{"n": 2}')])
    assert [s for _, _, s in rows(engine, stream)] == [b'{"n": 1}']


def test_a_deallocated_statement_is_prepared_again_and_the_event_stored_once(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE t (id bigserial, v text)")
        conn.execute(
            "CREATE FUNCTION pg_temp.app_one(a uuid, b int8, c text, d bytea, e bytea, f bytea) "
            "RETURNS bigint LANGUAGE sql AS $$ INSERT INTO t (v) VALUES (c) RETURNING id $$"
        )
        append = PreparedAppend("pg_temp.app_one")
        assert append(conn, uuid.uuid4(), 1, "first", b"", None, None) == 1
        conn.execute("DEALLOCATE ALL")  # what a pool's DISCARD ALL would do
        assert append(conn, uuid.uuid4(), 2, "second", b"", None, None) == 2
        assert [r[0] for r in conn.execute("SELECT v FROM t ORDER BY id").fetchall()] == ["first", "second"]


def test_a_lost_connection_is_an_operational_error_and_the_pool_replaces_it(engine: Engine) -> None:
    recorder = engine.log.recorder
    stream = uuid.uuid4()
    recorder.insert_events([event(stream, 1)])
    pool = recorder.datastore.pool
    with pool.connection() as conn:
        pid = conn.info.backend_pid
    with psycopg.connect(engine.settings.database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s", (pid,))
    failures = 0
    for version in (2, 3, 4):  # the killed connection fails once; the next try gets another
        for _ in range(3):
            try:
                recorder.insert_events([event(stream, version)])
                break
            except OperationalError:
                failures += 1
    assert failures <= 1
    assert [v for v, _, _ in rows(engine, stream)] == [1, 2, 3, 4]


def test_a_call_on_a_connection_whose_backend_died_raises_operational_error(database_url: str) -> None:
    # The other test depends on which pooled connection comes next; this one calls the dead one.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION pg_temp.app_one(a uuid, b int8, c text, d bytea, e bytea, f bytea) "
            "RETURNS bigint LANGUAGE sql AS $$ SELECT b $$"
        )
        append = PreparedAppend("pg_temp.app_one")
        assert append(conn, uuid.uuid4(), 7, "t", b"", None, None) == 7
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            append(conn, uuid.uuid4(), 8, "t", b"", None, None)
        assert conn.closed  # so a pool discards it
