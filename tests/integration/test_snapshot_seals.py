"""Snapshots are sealed under the chain key: one edited in the database without the key is not
read, and the session is its events' fold (``infrastructure/postgres/snapshot_seal.py``).

Before, a snapshot's total cost edited from 0.0054 to 99.0054 (or its user, or its step count)
was what ``get_session`` answered, and what the next steps added to, until ``audit verify``
compared the snapshot with its events."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal, is_sealed, stripped
from flowledger.infrastructure.settings import Settings
from tests.conftest import make_settings
from tests.support.snapshot_rows import snapshot_json

STEP_COST = Decimal("0.0012")
USAGE = LlmUsage(
    provider="openai",
    request_model="gpt-4.1-mini",
    input_tokens=100,
    output_tokens=20,
    cost_usd=STEP_COST,
    latency_ms=300.0,
)


@dataclass
class Log:
    url: str
    settings: Settings
    victim: UUID
    bystander: UUID

    def sql(self, statement: str, *params: object) -> int:
        """Run ``statement`` (``{}``: the snapshot table) as an intruder would; rows changed."""
        table = Identifier(self.settings.schema, "flowledger_snapshots")
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(SQL(statement).format(table), params).rowcount

    def snapshot(self, stream: UUID, version: int) -> tuple[str, bytes]:
        table = Identifier(self.settings.schema, "flowledger_snapshots")
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                SQL(
                    "SELECT topic, state FROM {} WHERE originator_id = %s AND originator_version = %s"
                ).format(table),
                (stream, version),
            ).fetchone()
        assert row is not None
        return str(row[0]), bytes(row[1])


@pytest.fixture
def log(database_url: str, pg_schema: str) -> Iterator[Log]:
    """Two sessions of 9 events (snapshots at versions 4 and 8), by a chaining engine."""
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=4)
    with Engine(settings=settings) as engine:
        for session in ("victim", "bystander"):
            engine.start_session(session, "cs", user_id=f"u-{session}")
            for n in range(8):
                engine.record_step(session, f"step-{n}", usage=USAGE, context_update={"n": n})
        yield Log(database_url, settings, engine.session_uuid("victim"), engine.session_uuid("bystander"))


def test_every_stored_snapshot_carries_a_seal_that_checks(log: Log) -> None:
    with Engine(settings=log.settings) as engine:
        key = engine.audit.chain_key
    stream_names = {log.victim: "victim", log.bystander: "bystander"}
    for stream in (log.victim, log.bystander):
        for version in (4, 8):
            topic, state = log.snapshot(stream, version)
            assert is_sealed(state)
            opened = SnapshotSeal(key).opened(StoredEvent(stream, version, topic, state))
            assert snapshot_json(state) == snapshot_json(opened.state)
            assert snapshot_json(opened.state)["state"]["session_id"] == stream_names[stream]


def test_a_cost_edited_in_place_in_a_snapshot_is_not_read_and_the_session_goes_on_from_its_events(
    log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the victim's true state, then its latest snapshot's total cost (0.0084 at version 8)
    # edited in place to 99.0084: the JSON changed, the bytes after it left as they were
    with Engine(settings=log.settings) as engine:
        before = engine.get_session("victim")
        cost = f'"_data_":"{engine.get_session("victim", version=8).totals.cost_usd}"'
    assert cost == '"_data_":"0.0084"'
    edited = log.sql(
        "UPDATE {} SET state = overlay(state placing convert_to(%s, 'UTF8')"
        " from position(convert_to(%s, 'UTF8') in state) for length(%s))"
        " WHERE originator_id = %s AND originator_version = 8",
        '"_data_":"99.0084"',
        cost,
        cost,
        log.victim,
    )
    assert edited == 1
    assert b'"_data_":"99.0084"' in log.snapshot(log.victim, 8)[1]
    # When a fresh engine reads it, records a step and reads it again
    with caplog.at_level(logging.WARNING), Engine(settings=log.settings) as engine:
        state = engine.get_session("victim")
        engine.record_step("victim", "after", usage=USAGE)
        after = engine.get_session("victim")
    # Then it reads as its events folded (it read the edited cost, and added to it, before)
    assert state == before
    assert after.totals.cost_usd == before.totals.cost_usd + STEP_COST == Decimal("0.0108")
    assert (after.step_count, after.version) == (9, 10)
    assert f"stream {log.victim}: its snapshot does not read back" in caplog.text


@pytest.mark.parametrize(
    "forgery",
    [
        pytest.param(
            "UPDATE {} s SET state = b.state FROM {} b WHERE s.originator_id = %s"
            " AND s.originator_version = 8 AND b.originator_id = %s AND b.originator_version = 8",
            id="another-sessions-snapshot-copied-over-it",
        ),
        pytest.param(
            "UPDATE {} SET originator_version = 9 WHERE originator_id = %s AND originator_version = 8"
            " AND %s IS NOT NULL",
            id="its-snapshot-moved-to-a-later-version",
        ),
        pytest.param(
            "UPDATE {} SET state = substring(state for length(state) - 61)"
            " WHERE originator_id = %s AND %s IS NOT NULL",
            id="its-seals-cut-off",
        ),
    ],
)
def test_a_snapshot_forged_from_sealed_parts_is_not_read(log: Log, forgery: str) -> None:
    # Given the victim's snapshots rearranged from rows that each carried a valid seal
    with Engine(settings=log.settings) as engine:
        before, at_8 = engine.get_session("victim"), engine.get_session("victim", version=8)
    table = Identifier(log.settings.schema, "flowledger_snapshots")
    with psycopg.connect(log.url, autocommit=True) as conn:
        changed = conn.execute(SQL(forgery).format(table, table), (log.victim, log.bystander)).rowcount
    assert changed >= 1
    # When a fresh engine reads the victim, then it is its own events' fold
    with Engine(settings=log.settings) as engine:
        assert engine.get_session("victim") == before
        assert engine.get_session("victim", version=8) == at_8
        assert engine.record_step("victim", "after").version == 10


def test_an_unsealed_snapshot_is_passed_over_and_the_next_one_is_sealed(log: Log) -> None:
    # Given the victim's snapshots stored without seals (as before snapshots were sealed)
    cut = "UPDATE {} SET state = substring(state for length(state) - 61) WHERE originator_id = %s"
    assert log.sql(cut, log.victim) == 2
    # When a fresh engine reads the session and takes it past its next snapshot (version 12)
    with Engine(settings=log.settings) as engine:
        assert engine.get_session("victim").step_count == 8
        for n in range(3):
            engine.record_step("victim", f"more-{n}")
    # Then the new snapshot is sealed, and an engine reads the session from it
    topic, state = log.snapshot(log.victim, 12)
    assert is_sealed(state)
    assert topic == "eventsourcing.domain:Snapshot"
    with Engine(settings=log.settings) as engine:
        assert engine.get_session("victim").step_count == 11


def test_an_engine_that_does_not_chain_reads_sealed_snapshots(log: Log) -> None:
    with Engine(settings=log.settings) as engine:
        before = engine.get_session("victim")
    with Engine(settings=log.settings.with_overrides(audit_chain=False)) as engine:
        assert engine.get_session("victim") == before
        assert engine.record_step("victim", "after").version == 10


def test_the_seal_names_its_stream_version_topic_and_state() -> None:
    seal = SnapshotSeal(b"k" * 32)
    stream = UUID(int=7)
    sealed = seal.sealed(StoredEvent(stream, 4, "a:B.Snapshot", b'{"x":1}'))
    assert stripped(sealed).state == b'{"x":1}'
    assert seal.opened(sealed).state == b'{"x":1}'
    for forged in (
        StoredEvent(UUID(int=8), 4, sealed.topic, sealed.state),
        StoredEvent(stream, 5, sealed.topic, sealed.state),
        StoredEvent(stream, 4, "a:C.Snapshot", sealed.state),
        StoredEvent(stream, 4, sealed.topic, sealed.state.replace(b"1", b"2", 1)),
    ):
        with pytest.raises(StoredEventUnreadable, match="its seal does not match"):
            seal.opened(forged)
    with pytest.raises(StoredEventUnreadable, match="it carries no seal"):
        seal.opened(StoredEvent(stream, 4, sealed.topic, b'{"x":1}'))
    with pytest.raises(StoredEventUnreadable, match="its seal does not match"):
        SnapshotSeal(b"j" * 32).opened(sealed)
