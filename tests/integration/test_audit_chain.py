"""The audit chain is written with every event: hashes link each stream, seals use the engine's key."""

from __future__ import annotations

import psycopg
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit_keys import chain_key
from flowledger.verify import GENESIS, event_hash, event_mac
from tests.conftest import make_settings


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
