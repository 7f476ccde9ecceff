"""The audit chain is written with every event: hashes link each stream, seals use the engine's key."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage
from flowledger.domain.errors import AuditError, StoredEventAltered, ValidationError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit_keys import chain_key
from flowledger.infrastructure.postgres.chain_verify import chain_existing, verify_chain
from flowledger.infrastructure.postgres.database import migrate
from flowledger.infrastructure.postgres.migrations import SCHEMA_VERSION
from flowledger.verify import GENESIS, event_hash, event_mac
from tests.conftest import make_settings
from tests.support.partitions import both_layouts

pytest_generate_tests = both_layouts  # each test on the one-table and the 4-partition log


def stored_rows(database_url: str, schema: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            SQL(
                "SELECT originator_id, originator_version, topic, state, event_hash, event_mac "
                "FROM {}.flowledger_events ORDER BY originator_id, originator_version"
            ).format(Identifier(schema))
        ).fetchall()


def test_every_event_of_sessions_tasks_and_agents_is_chained_and_sealed_when_written(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given sessions, a task and an agent written through the one write path
    for n in range(2):
        pg_engine.start_session(f"c-{n}", "cs")
        pg_engine.record_step(f"c-{n}", "greet", usage=LlmUsage(input_tokens=5, output_tokens=1))
        pg_engine.record_step(f"c-{n}", "answer")
    pg_engine.complete_session("c-0", "done")
    pg_engine.register_agent("agent-1", "Ada", ["billing"], 2)
    pg_engine.create_task("task-1", "billing question", ["billing"])
    pg_engine.assign_task("task-1")
    # Then every row carries its chained hash and a seal under the engine's key
    key = chain_key(pg_engine.settings)
    previous: dict[str, bytes] = {}
    rows = stored_rows(database_url, pg_schema)
    assert len({row[0] for row in rows}) >= 4
    for stream, version, topic, state, stored_hash, stored_mac in rows:
        name = str(stream)
        expected = event_hash(previous.get(name, GENESIS), name, version, topic, bytes(state))
        assert bytes(stored_hash) == expected
        assert bytes(stored_mac) == event_mac(key, name, version, expected)
        previous[name] = expected


def test_a_second_engine_continues_the_chain_from_the_database(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given a session written by one engine, then continued by another (its cache is empty)
    pg_engine.start_session("s", "cs")
    pg_engine.record_step("s", "one")
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        other.record_step("s", "two")
    pg_engine.record_step("s", "three")  # this engine's cache is stale: the version key decides
    # Then the chain links all four events
    rows = stored_rows(database_url, pg_schema)
    previous = GENESIS
    for stream, version, topic, state, stored_hash, _ in rows:
        previous = event_hash(previous, str(stream), version, topic, bytes(state))
        assert bytes(stored_hash) == previous
    assert len(rows) == 4


def test_with_the_chain_off_rows_are_stored_unchained(database_url: str, pg_schema: str) -> None:
    with Engine(
        settings=make_settings(database_url=database_url, schema=pg_schema, audit_chain=False)
    ) as off:
        off.start_session("s", "cs")
    assert [row[4:] for row in stored_rows(database_url, pg_schema)] == [(None, None)]


def test_a_log_from_before_the_chain_is_upgraded_by_migrate_and_chained_by_audit_chain(
    database_url: str, pg_schema: str
) -> None:
    # Given a schema at version 2 (no chain columns) with events in it
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    with Engine(settings=settings.with_overrides(audit_chain=False)) as old:
        old.start_session("legacy", "cs")
        old.record_step("legacy", "greet")
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in (
            "ALTER TABLE {}.flowledger_events DROP COLUMN event_hash, DROP COLUMN event_mac",
            "DROP TABLE {}.flowledger_checkpoints",
            "UPDATE {}.flowledger_schema SET version = 2",
        ):
            conn.execute(SQL(statement).format(Identifier(pg_schema)))
    # When an engine of this version starts (migrate runs) and appends to the old stream
    with Engine(settings=settings) as engine:
        engine.record_step("legacy", "answer")
        assert migrate(database_url, pg_schema).version == SCHEMA_VERSION
        before = verify_chain(engine.audit)
        # Then the old events are reported unchained until `audit chain` chains them
        assert [(f.kind, f.version) for f in before.findings] == [("unchained", 1)]
        upgrade = chain_existing(engine.audit)
        assert (upgrade.rows, upgrade.streams, upgrade.through_position) == (2, 1, 2)
        engine.record_step("legacy", "bye")
        engine.audit.checkpoint()
        after = verify_chain(engine.audit)
    assert after.ok, after.findings
    assert (after.events, after.upgraded_through) == (4, 2)


def test_the_engine_takes_checkpoints_every_n_events_in_the_background(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=5, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
        for n in range(5):
            engine.record_step("s", f"step-{n}")
        deadline = time.monotonic() + 10
        taken: list[tuple] = []
        while not taken and time.monotonic() < deadline:
            time.sleep(0.2)
            with psycopg.connect(database_url) as conn:
                taken = conn.execute(
                    SQL("SELECT seq, position FROM {}.flowledger_checkpoints").format(Identifier(pg_schema))
                ).fetchall()
    assert taken == [(1, 6)]


def test_a_checkpoint_over_unchained_events_is_refused_with_what_to_run(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    with Engine(settings=settings.with_overrides(audit_chain=False)) as off:
        off.start_session("s", "cs")
        with pytest.raises(AuditError, match="run `flowledger audit chain` before taking a checkpoint"):
            off.audit.checkpoint()
        chain_existing(off.audit)
        assert off.audit.checkpoint().seq == 1


def test_a_checkpoint_over_a_signed_head_deleted_and_written_again_is_refused(
    database_url: str, pg_schema: str
) -> None:
    """A checkpoint signed whatever heads the log held: a signed last event deleted and its
    version written again by the application was signed over by the next checkpoint (engines
    take one every 5 minutes), and ``audit verify --since-checkpoint`` then said ok."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        # Given a session whose last event (version 3) checkpoint 1 signed, and another one
        engine.start_session("s", "cs")
        engine.record_step("s", "greet")
        engine.record_step("s", "costly", usage=LlmUsage(input_tokens=9, output_tokens=9))
        engine.start_session("other", "cs")
        engine.audit.checkpoint()
        stream = engine.session_uuid("s")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            SQL(
                "DELETE FROM {}.flowledger_events WHERE originator_id = %s AND originator_version = 3"
            ).format(Identifier(pg_schema)),
            (stream,),
        )
    with Engine(settings=settings) as engine:
        # And version 3 written again by the application, and the other session continued
        engine.record_step("s", "cheap")
        engine.record_step("other", "greet")
        # When a checkpoint is taken, Then it is refused, naming the stream and version
        with pytest.raises(
            AuditError, match=f"checkpoint refused: stream {stream} version 3, signed by checkpoint 1"
        ):
            engine.audit.checkpoint()
        # And the latest checkpoint still signs the old head: the nightly check names the stream
        since = verify_chain(engine.audit, since_checkpoint=True)
        assert [(f.kind, f.stream, f.version) for f in since.findings] == [("altered", stream, 3)]


def test_a_checkpoint_after_a_stream_is_continued_normally_is_taken(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
        engine.audit.checkpoint()
    with Engine(settings=settings) as engine:
        engine.record_step("s", "greet")
        assert engine.audit.checkpoint().seq == 2
        assert verify_chain(engine.audit).ok


def test_an_in_memory_engine_has_no_audit_trail() -> None:
    with Engine.in_memory() as engine, pytest.raises(ValidationError, match="needs PostgreSQL"):
        _ = engine.audit


def test_engines_racing_on_one_session_leave_a_chain_that_verifies(database_url: str, pg_schema: str) -> None:
    # Given four engines (like four processes, each with its own remembered heads) on one session
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    engines = [Engine(settings=settings) for _ in range(4)]
    try:
        engines[0].start_session("shared", "cs")

        def steps(engine: Engine, n: int) -> None:
            for i in range(8):
                engine.record_step("shared", f"e{n}-{i}")

        # When they all record steps at once (version clashes retried by the store)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(steps, engines, range(4)))
        engines[1].audit.checkpoint()
        # Then every link and seal holds
        report = verify_chain(engines[2].audit)
    finally:
        for engine in engines:
            engine.close()
    assert report.ok, report.findings
    assert report.events == 33


def test_a_row_appended_with_the_chain_off_after_chained_ones_is_refused_until_audit_chain(
    database_url: str, pg_schema: str
) -> None:
    """A row without a hash after one with a hash is what removing an edited row's hash leaves
    (a read had served the edit then): an engine that chains refuses it, naming `audit chain`,
    which chains the rows an engine with the chain off wrote; then the stream reads again."""
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
    with Engine(settings=settings.with_overrides(audit_chain=False)) as off:
        off.record_step("s", "greet")
    with Engine(settings=settings) as engine:
        with pytest.raises(
            StoredEventAltered, match="version 2 has no hash, after a row that has one"
        ) as raised:
            engine.history("s")
        assert "`flowledger audit chain` chains such rows" in str(raised.value)
        chain_existing(engine.audit)
        assert [entry.version for entry in engine.history("s")] == [1, 2]
