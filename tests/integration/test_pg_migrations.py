"""migrate: once per database under a lock, and the log's invariants enforced at every start."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import DataError, PersistenceError, StoredEvent, Tracking
from eventsourcing.utils import Environment
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure.postgres.database import library_env, migrate
from flowledger.infrastructure.postgres.ddl import append_function_name
from flowledger.infrastructure.postgres.factory import (
    FlowledgerPostgresFactory,
    FlowledgerProcessRecorder,
)
from flowledger.infrastructure.postgres.migrations import SCHEMA_VERSION
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.infrastructure.postgres.sql import (
    create_append_functions,
    in_flight_lock_space,
    section_lock_key,
)
from flowledger.infrastructure.settings import Settings
from tests.integration.test_recorder_gaps import append_uncommitted

pytestmark = pytest.mark.postgres


def event(stream: uuid.UUID | None = None, version: int = 1) -> StoredEvent:
    return StoredEvent(
        originator_id=stream or uuid.uuid4(), originator_version=version, topic="t:E", state=b"{}"
    )


def open_factory(database_url: str, schema: str, **settings: Any) -> FlowledgerPostgresFactory:
    env = library_env(database_url, schema=schema, pool_size=4, settings=Settings(**settings))
    return FlowledgerPostgresFactory(Environment("flowledger", env))


@pytest.fixture
def factory(database_url: str, pg_schema: str) -> Iterator[FlowledgerPostgresFactory]:
    migrate(database_url, pg_schema)
    made = open_factory(database_url, pg_schema)
    yield made
    made.close()


@pytest.fixture
def recorder(factory: FlowledgerPostgresFactory) -> FlowledgerApplicationRecorder:
    made = factory.application_recorder()
    assert isinstance(made, FlowledgerApplicationRecorder)
    return made


def section_locks_held(database_url: str, schema: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s::bigint",
            (section_lock_key(schema, "flowledger_events"),),
        ).fetchone()
    return int(row[0]) if row else -1


def execute(database_url: str, statement: Any, params: Any = None) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(statement, params)


def test_sixteen_engines_starting_at_once_on_a_new_schema_all_start(
    database_url: str, pg_schema: str
) -> None:
    # Given 16 starters released at the same moment on a schema that does not exist yet
    barrier = threading.Barrier(16)

    def start(n: int) -> tuple[bool, list[int]]:
        barrier.wait()
        report = migrate(database_url, pg_schema)
        factory = open_factory(database_url, pg_schema)
        try:
            events = factory.application_recorder()
            snapshots = factory.aggregate_recorder("snapshots")
            snapshots.insert_events([event()])
            ids = events.insert_events([event()])
            return report.created, list(ids or [])
        finally:
            factory.close()

    # When each migrates, builds the library's recorders and appends
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(start, range(16)))

    # Then none failed, the DDL ran exactly once, and every append got its own id
    assert sum(created for created, _ in results) == 1
    assert sorted(i for _, ids in results for i in ids) == list(range(1, 17))


def test_a_migrated_schema_is_skipped_without_the_lock(database_url: str, pg_schema: str) -> None:
    first = migrate(database_url, pg_schema)
    again = migrate(database_url, pg_schema)
    assert (first.locked, first.created) == (True, True)
    assert (again.locked, again.created) == (False, False)


def test_migrate_resets_a_sequence_cache_to_1(database_url: str, pg_schema: str) -> None:
    # Given a migrated log whose sequence someone gave a cache of 10
    migrate(database_url, pg_schema)
    execute(database_url, SQL("ALTER SEQUENCE {}.{} CACHE 10").format(*_sequence(pg_schema)))

    # When an engine starts
    report = migrate(database_url, pg_schema)

    # Then the sequence hands out one id at a time again
    assert report.sequence_cache_reset
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT cache_size FROM pg_sequences WHERE schemaname = %s AND sequencename = %s",
            (pg_schema, "flowledger_events_notification_id_seq"),
        ).fetchone()
    assert row == (1,)


def _sequence(schema: str) -> tuple[Identifier, Identifier]:
    return Identifier(schema), Identifier("flowledger_events_notification_id_seq")


def make_foreign(database_url: str, schema: str, ids: list[int]) -> None:
    """Give these rows a transaction id far beyond this cluster's counter."""
    statement = (
        "UPDATE {}.flowledger_events SET transaction_id = '999999999999' WHERE notification_id = ANY(%s)"
    )
    execute(database_url, SQL(statement).format(Identifier(schema)), (ids,))


def test_rows_restored_from_an_older_cluster_are_readable_after_migrate(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given a log whose last row carries a transaction id this cluster has not reached
    # (as after pg_dump/restore into a younger cluster)
    for _ in range(3):
        recorder.insert_events([event()])
    execute(
        database_url,
        SQL(
            "UPDATE {}.flowledger_events SET transaction_id = '999999999999' WHERE notification_id = 3"
        ).format(Identifier(pg_schema)),
    )
    assert foreign_rows(database_url, pg_schema) == 1

    # When an engine starts
    report = migrate(database_url, pg_schema)

    # Then the row is repaired and readable, and new appends follow it
    assert report.foreign_rows_repaired == 1
    recorder.insert_events([event()])
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2, 3, 4]


def test_a_restore_into_another_cluster_repairs_every_foreign_row(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given foreign ids on rows before the last one, and a version row from another cluster
    for _ in range(4):
        recorder.insert_events([event()])
    schema = Identifier(pg_schema)
    execute(
        database_url,
        SQL(
            "UPDATE {}.flowledger_events SET transaction_id = '999999999999' WHERE notification_id IN (2, 3)"
        ).format(schema),
    )
    execute(database_url, SQL("UPDATE {}.flowledger_schema SET cluster_id = 'elsewhere'").format(schema))
    assert foreign_rows(database_url, pg_schema) == 2

    # When an engine starts
    report = migrate(database_url, pg_schema)

    # Then all are repaired, and the next start takes the fast path again
    assert report.foreign_rows_repaired == 2
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2, 3, 4]
    assert not migrate(database_url, pg_schema).locked


def foreign_rows(database_url: str, schema: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            SQL(
                "SELECT count(*) FROM {}.flowledger_events "
                "WHERE transaction_id >= pg_snapshot_xmax(pg_current_snapshot())"
            ).format(Identifier(schema))
        ).fetchone()
    return int(row[0]) if row else -1


def test_a_reader_repairs_rows_copied_in_from_another_cluster_while_engines_run(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given foreign transaction ids on rows in the middle of a live log (a logical copy
    # while engines ran), the newest row this cluster's: the start-up check does not see them
    for _ in range(5):
        recorder.insert_events([event()])
    make_foreign(database_url, pg_schema, [2, 4])
    assert not migrate(database_url, pg_schema).locked

    # When a reader pages through the log, and asks for its head
    started = time.monotonic()
    read = [n.id for n in recorder.select_notifications(None, 10)]

    # Then it rewrote them and read every row at once, not after its horizon wait
    assert read == [1, 2, 3, 4, 5]
    assert time.monotonic() - started < recorder.horizon_wait
    assert foreign_rows(database_url, pg_schema) == 0
    make_foreign(database_url, pg_schema, [5])
    assert recorder.max_notification_id() == 5
    assert foreign_rows(database_url, pg_schema) == 0


def test_a_reader_that_may_not_write_leaves_foreign_rows_and_says_so(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder, caplog: Any
) -> None:
    # Given a foreign row, and a reader whose role may only read
    for _ in range(3):
        recorder.insert_events([event()])
    make_foreign(database_url, pg_schema, [2])
    role = f"reader_{uuid.uuid4().hex[:12]}"
    execute(database_url, SQL("CREATE ROLE {} LOGIN").format(Identifier(role)))
    try:
        grants = "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {r}"
        execute(database_url, SQL(grants).format(s=Identifier(pg_schema), r=Identifier(role)))
        conninfo = psycopg.conninfo.make_conninfo(database_url, user=role)
        reader = open_factory(conninfo, pg_schema)
        try:
            made = reader.application_recorder()
            assert isinstance(made, FlowledgerApplicationRecorder)
            made.horizon_wait = 0.05

            # When it reads, twice
            first = [n.id for n in made.select_notifications(None, 10)]
            second = [n.id for n in made.select_notifications(None, 10)]
        finally:
            reader.close()
    finally:
        drop = "DROP OWNED BY {r}; DROP ROLE {r}"
        execute(database_url, SQL(drop).format(r=Identifier(role)))

    # Then it stops before the row as before, and says once what to run
    assert first == second == [1]
    told = [r for r in caplog.records if "flowledger migrate" in r.getMessage()]
    assert len(told) == 1
    assert foreign_rows(database_url, pg_schema) == 1


def _exhaust_sequence(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            SQL("SELECT last_value FROM {}.{}").format(*_sequence(schema)),
        ).fetchone()
        assert row is not None
        conn.execute(SQL("ALTER SEQUENCE {}.{} MAXVALUE {}").format(*_sequence(schema), row[0]))


def test_cancels_and_statement_timeouts_anywhere_in_an_append_leave_no_lock_held(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # (An append whose unlock came after its exception block left the section's lock held
    # when a cancel was taken at that unlock: 3 of 93 cancelled appends in a 20 s run of
    # this loop, which then blocked every other writer.)
    recorder.insert_events([event()])
    append = SQL("SELECT {}.flowledger_events_append_one(%s, 1, 't:E', '{{}}', NULL, NULL)").format(
        Identifier(pg_schema)
    )
    held_query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
        "AND granted AND ((classid::bigint << 32) | objid::bigint) = %s::bigint"
    )
    key = section_lock_key(pg_schema, "flowledger_events")
    started = time.monotonic()
    counts = Counter[str]()

    def going() -> bool:
        # Until enough appends were cut short (a loaded machine finishes most before their
        # cancel lands), within 3 to 15 s
        elapsed = time.monotonic() - started
        return elapsed < 3.0 or (counts["cancelled"] < 40 and elapsed < 15.0)

    def blocker() -> None:
        # Holds the section's lock for a moment now and then, so that appends wait inside
        # their id section and their timeouts and cancels land there
        chance = random.Random(99)
        with psycopg.connect(database_url, autocommit=True) as conn:
            while going():
                conn.execute("SELECT pg_advisory_lock(%s)", (key,))
                time.sleep(chance.uniform(0, 0.003))
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                time.sleep(chance.uniform(0, 0.003))

    def writer(seed: int) -> None:
        chance = random.Random(seed)
        with psycopg.connect(database_url, autocommit=True) as conn:
            while going():
                # Given appends cut short at random moments, by a statement timeout or a cancel
                # (one of the two: a second cancel while the handler runs can stop it before
                # its unlock, which is why the recorder closes a cancelled connection)
                by_timeout = chance.random() < 0.5
                timeout_ms = chance.choice((1, 1, 2, 3)) if by_timeout else 0
                conn.execute(f"SET statement_timeout = '{timeout_ms}ms'".encode())
                timer = threading.Timer(chance.uniform(0, 0.0008), conn.cancel)
                if not by_timeout:
                    timer.start()
                outcome = "stored"
                try:
                    conn.execute(append, (uuid.uuid4(),))
                except psycopg.errors.QueryCanceled:
                    outcome = "cancelled"
                finally:
                    timer.cancel()
                    if not by_timeout:
                        timer.join()
                counts[outcome] += 1
                while True:  # a cancel may still land on the next statement
                    try:
                        conn.execute("SET statement_timeout = 0")
                        break
                    except psycopg.errors.QueryCanceled:
                        continue
                # Then the connection never keeps the lock
                row = conn.execute(held_query, (key,)).fetchone()
                if row and row[0]:
                    counts[f"held after {outcome}"] += 1
                    conn.execute("SELECT pg_advisory_unlock_all()")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=blocker))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counts["cancelled"] >= 10, counts
    # A stored append never leaves it held; a cancelled one only by the rare second interrupt
    # taken while the handler runs, before its unlock (docs/recorder.md: 1 of 313 in one CI
    # run), which is why the recorder closes a connection whose append was cancelled (the next
    # test); the bug this guards against held it after 3 of 93
    assert counts["held after stored"] == 0, counts
    assert counts["held after cancelled"] <= max(1, counts["cancelled"] // 100), counts
    assert section_locks_held(database_url, pg_schema) == 0


def test_a_pooled_append_cancelled_twice_leaves_no_lock_held(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given writers appending through the recorder's pool
    ends = time.monotonic() + 4.0
    counts = Counter[str]()
    cancel = (
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
        "AND state = 'active' AND query LIKE %s"
    )

    def writer() -> None:
        while time.monotonic() < ends:
            try:
                recorder.insert_events([event()])
                counts["stored"] += 1
            except PersistenceError:
                counts["failed"] += 1

    def canceller() -> None:
        # When another session cancels their appends, twice in a row (the second can land
        # while the function's exception handler runs, before its unlock)
        with psycopg.connect(database_url, autocommit=True) as conn:
            while time.monotonic() < ends:
                for _ in range(2):
                    conn.execute(cancel, (f"%{pg_schema}%append%",))
                time.sleep(0.001)

    threads = [threading.Thread(target=writer) for _ in range(3)] + [threading.Thread(target=canceller)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then no connection, pooled or closed, holds the id section's lock, and appends go on
    assert counts["failed"] > 0, counts
    assert section_locks_held(database_url, pg_schema) == 0
    append_without_waiting(database_url, pg_schema)
    assert recorder.insert_events([event()])


def append_without_waiting(database_url: str, schema: str) -> None:
    """One append on a connection of its own that fails, rather than waits, on a held lock."""
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SET lock_timeout = '1s'")
        other.execute(
            SQL("SELECT {}.flowledger_events_append_one(%s, 1, 't:E', '{{}}', NULL, NULL)").format(
                Identifier(schema)
            ),
            (uuid.uuid4(),),
        )


def test_a_failure_inside_the_id_section_releases_the_lock(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given a sequence that cannot hand out another id (nextval fails inside the section)
    recorder.insert_events([event(), event()])
    _exhaust_sequence(database_url, pg_schema)

    # When an append fails there, single or multi-event
    with pytest.raises(DataError, match="maximum value"):
        recorder.insert_events([event()])
    with pytest.raises(DataError, match="maximum value"):
        recorder.insert_events([event(), event()])

    # Then no session holds the section's lock, and once ids are available again
    # another connection appends without waiting (a held lock would hit lock_timeout)
    assert section_locks_held(database_url, pg_schema) == 0
    execute(database_url, SQL("ALTER SEQUENCE {}.{} NO MAXVALUE").format(*_sequence(pg_schema)))
    append_without_waiting(database_url, pg_schema)
    assert recorder.insert_events([event()])


def test_a_cancel_while_waiting_for_the_section_leaves_no_lock(
    database_url: str, pg_schema: str, recorder: FlowledgerApplicationRecorder
) -> None:
    # Given another session holding the section's lock
    key = section_lock_key(pg_schema, "flowledger_events")
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        # When an append times out waiting for it
        with psycopg.connect(database_url, autocommit=True) as writer:
            writer.execute("SET statement_timeout = '200ms'")
            with pytest.raises(psycopg.errors.QueryCanceled):
                writer.execute(
                    SQL("SELECT {}.flowledger_events_append_one(%s, 1, 't:E', '{{}}', NULL, NULL)").format(
                        Identifier(pg_schema)
                    ),
                    (uuid.uuid4(),),
                )
            # Then it did not unlock the holder's lock, and holds none itself
            assert section_locks_held(database_url, pg_schema) == 1
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert section_locks_held(database_url, pg_schema) == 0
    assert recorder.insert_events([event()])


def test_the_tracking_path_fails_promptly_and_leaves_no_lock(
    database_url: str, pg_schema: str, factory: FlowledgerPostgresFactory
) -> None:
    # Given a process recorder (events plus tracking) whose sequence is exhausted
    recorder = factory.process_recorder()
    assert isinstance(recorder, FlowledgerProcessRecorder)
    recorder.insert_events([event(), event()], tracking=Tracking("upstream", 1))
    _exhaust_sequence(database_url, pg_schema)

    # When an append with tracking fails in the id section
    with pytest.raises(DataError):
        recorder.insert_events([event()], tracking=Tracking("upstream", 2))

    # Then neither the lock nor the tracking position moved
    assert section_locks_held(database_url, pg_schema) == 0
    assert recorder.max_tracking_id("upstream") == 1


def test_behind_pgbouncer_nothing_is_prepared_on_the_server(database_url: str, pg_schema: str) -> None:
    # Given an engine configured for PgBouncer transaction pooling
    migrate(database_url, pg_schema)
    factory = open_factory(database_url, pg_schema, pgbouncer=True)
    try:
        recorder = factory.application_recorder()
        # When it appends and reads many times (psycopg prepares after 5 uses by default)
        stream = uuid.uuid4()
        for version in range(1, 11):
            recorder.insert_events([event(stream, version)])
            recorder.select_events(stream)
            recorder.select_notifications(None, 10)
        # Then no connection of its pool holds a server-side prepared statement
        with factory.datastore.get_connection() as conn:
            row = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()
            assert row is not None
            assert row["n"] == 0
            assert conn.prepare_threshold is None
    finally:
        factory.close()


def test_without_pgbouncer_the_pool_carries_the_statement_timeout(database_url: str, pg_schema: str) -> None:
    migrate(database_url, pg_schema)
    factory = open_factory(database_url, pg_schema, statement_timeout_s=0.2)
    try:
        with factory.datastore.get_connection() as conn:
            row = conn.execute("SELECT current_setting('statement_timeout') AS t").fetchone()
            assert row is not None
            assert row["t"] == "200ms"
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(1)")
    finally:
        factory.close()


def test_settings_read_pgbouncer_and_deadlines_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "FLOWLEDGER_PGBOUNCER": "1",
            "FLOWLEDGER_STATEMENT_TIMEOUT_S": "2.5",
            "FLOWLEDGER_POOL_TIMEOUT_S": "1",
        }
    )
    assert settings.pgbouncer
    assert settings.statement_timeout_s == 2.5
    assert settings.pool_timeout_s == 1.0
    assert not Settings.from_env({}).pgbouncer


def _downgrade_to_version_1(database_url: str, schema: str) -> None:
    """The log as schema version 1 left it: append functions without the in-flight marker."""
    table = "flowledger_events"
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in create_append_functions(
            schema=schema,
            table=table,
            function=append_function_name(table),
            id_type="uuid",
            sequence=f"{schema}.{table}_notification_id_seq",
            lock_key=section_lock_key(schema, table),
            in_flight_space=in_flight_lock_space(schema, table),
        ):
            lines = statement.as_string(conn).split("\n")
            conn.execute("\n".join(line for line in lines if "pg_advisory_xact_lock_shared" not in line))
        conn.execute(SQL("UPDATE {}.flowledger_schema SET version = 1").format(Identifier(schema)))


def test_migrate_upgrades_a_version_1_log_to_appends_that_readers_can_see_in_flight(
    database_url: str, pg_schema: str
) -> None:
    # Given a version-1 log with a row, and an append still open that ran the old function
    migrate(database_url, pg_schema)
    factory = open_factory(database_url, pg_schema)
    try:
        old = factory.application_recorder()
        assert isinstance(old, FlowledgerApplicationRecorder)
        old.insert_events([event()])
        _downgrade_to_version_1(database_url, pg_schema)
        ctx, conn = append_uncommitted(old, [event()])
        committer = threading.Timer(0.5, lambda: conn.execute("COMMIT"))
        committer.start()
        try:
            # When an engine of this version starts
            started = time.monotonic()
            report = migrate(database_url, pg_schema)
            waited = time.monotonic() - started
        finally:
            committer.join()
            ctx.__exit__(None, None, None)
        # Then the log is upgraded in place, after the old append finished (readers cannot see it)
        assert (report.version, report.locked, report.created) == (SCHEMA_VERSION, True, True)
        assert waited >= 0.4
        with psycopg.connect(database_url) as check:
            version = SQL("SELECT version FROM {}.flowledger_schema").format(Identifier(pg_schema))
            assert check.execute(version).fetchone() == (SCHEMA_VERSION,)
        assert [n.id for n in old.select_notifications(None, 10)] == [1, 2]
        # And an append open now holds readers back: it runs the new function, with its marker
        old.horizon_wait = 0.1
        ctx, conn = append_uncommitted(old, [event()])
        try:
            old.insert_events([event()])
            assert [n.id for n in old.select_notifications(None, 10)] == [1, 2]
            assert old.horizon_lag().held_back == 1
            conn.execute("COMMIT")
        finally:
            ctx.__exit__(None, None, None)
        assert [n.id for n in old.select_notifications(None, 10)] == [1, 2, 3, 4]
    finally:
        factory.close()
