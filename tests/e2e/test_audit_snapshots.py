"""A snapshot edited in the database: ``flowledger audit verify`` names it, as it names an
edited event (snapshots are not chained, but a load starts from them). Snapshots are sealed
under the chain key: an edit without the key breaks the seal, and loads pass the snapshot over;
one sealed again with the key (or written wrong by an engine) is compared with its events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal, stripped
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from tests.conftest import make_settings
from tests.support.cli import run_cli


@dataclass
class Snapshotted:
    url: str
    schema: str
    victim: UUID
    key: bytes

    def edit_snapshot(self, version: int, *, reseal: bool, **fields: Any) -> None:
        """Change fields of the victim's snapshot state; ``reseal``: seal it again with the key."""
        table = Identifier(self.schema, "flowledger_snapshots")
        where = SQL("WHERE originator_id = %s AND originator_version = %s")
        with psycopg.connect(self.url, autocommit=True) as conn:
            ((topic, state),) = conn.execute(
                SQL("SELECT topic, state FROM {} {}").format(table, where), (self.victim, version)
            ).fetchall()
            body = stripped(StoredEvent(self.victim, version, topic, bytes(state))).state
            payload = json.loads(body)
            payload["state"].update(fields)
            edited = StoredEvent(self.victim, version, topic, json.dumps(payload).encode())
            # Sealed again with the key, or with the seal it had (an edit in place of the JSON)
            edited = (
                SnapshotSeal(self.key).sealed(edited)
                if reseal
                else StoredEvent(self.victim, version, topic, edited.state + bytes(state)[len(body) :])
            )
            conn.execute(
                SQL("UPDATE {} SET state = %s {}").format(table, where), (edited.state, self.victim, version)
            )


@pytest.fixture
def snapshotted(database_url: str, pg_schema: str) -> Iterator[Snapshotted]:
    settings = make_settings(
        database_url=database_url,
        schema=pg_schema,
        snapshot_interval=4,
        checkpoint_every_events=0,
        checkpoint_every_s=0,
    )
    with Engine(settings=settings) as engine:
        for session in ("victim", "bystander"):
            engine.start_session(session, "cs", user_id="u-1")
            for n in range(8):  # snapshots at versions 4 and 8
                engine.record_step(session, f"step-{n}", input={"n": n})
        yield Snapshotted(database_url, pg_schema, engine.session_uuid("victim"), engine.audit.chain_key)


def test_an_untouched_snapshotted_log_verifies(snapshotted: Snapshotted) -> None:
    result = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify")
    assert result.returncode == 0, result.stderr
    assert "18 events in 2 streams: no problems found, but not proven" in result.stderr


def test_a_snapshot_edited_without_the_key_is_named_and_passed_over_by_loads(
    snapshotted: Snapshotted,
) -> None:
    # Given the victim's latest snapshot edited in the database: another user, a hundred times
    # the steps (before snapshots were sealed, get_session answered the edit until audit verify
    # next ran)
    with Engine(settings=_settings(snapshotted)) as engine:
        before = engine.get_session("victim")
    snapshotted.edit_snapshot(8, reseal=False, user_id="mallory", step_count=700)
    # When a fresh engine reads the session, and the log is verified
    with Engine(settings=_settings(snapshotted)) as engine:
        state = engine.get_session("victim")
    problems = _problems_whole_and_alone(snapshotted)
    # Then the session is its events' fold, and verify exits 1 naming the snapshot's broken seal
    assert state == before
    assert (state.user_id, state.step_count) == ("u-1", 8)
    assert problems == [
        f"problem: snapshot of {snapshotted.victim} at version 8: does not read back: snapshot: its"
        " seal does not match its stream, version, topic and state (changed in the database)"
    ]


def test_audit_verify_names_a_sealed_snapshot_that_differs_from_its_events(snapshotted: Snapshotted) -> None:
    # Given the victim's latest snapshot edited and sealed again with the chain key (as a key
    # holder could, or an engine whose snapshot code is wrong would store it)
    snapshotted.edit_snapshot(8, reseal=True, user_id="mallory", step_count=700)
    # When the whole log, or the victim's session alone, is verified, then both exit 1 naming
    # the snapshot, its stream and version and the fields that differ
    assert _problems_whole_and_alone(snapshotted) == [
        f"problem: snapshot of {snapshotted.victim} at version 8: altered: step_count, user_id"
        " differ from its events folded to that version"
    ]


def _settings(snapshotted: Snapshotted) -> Any:
    return make_settings(database_url=snapshotted.url, schema=snapshotted.schema, snapshot_interval=4)


def _problems_whole_and_alone(snapshotted: Snapshotted) -> list[str]:
    """The ``problem:`` lines of ``audit verify`` of the whole log, which must be those of the
    victim's session alone; each run exits 1."""
    found: list[list[str]] = []
    for session in ([], ["--session", "victim"]):
        result = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify", *session)
        assert result.returncode == 1, result.stderr
        found.append([line for line in result.stderr.splitlines() if line.startswith("problem:")])
    assert found[0] == found[1]
    return found[0]


def test_a_snapshot_of_a_version_the_stream_never_reached_is_named(snapshotted: Snapshotted) -> None:
    # Given a snapshot moved past the stream's last event (a session read as if it had more)
    table = Identifier(snapshotted.schema, "flowledger_snapshots")
    with psycopg.connect(snapshotted.url, autocommit=True) as conn:
        conn.execute(
            SQL(
                "UPDATE {} SET originator_version = 12 WHERE originator_id = %s AND originator_version = 8"
            ).format(table),
            (snapshotted.victim,),
        )
    result = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify", "--session", "victim")
    assert result.returncode == 1, result.stderr
    # Its seal names its version: moved, it no longer checks (a snapshot sealed at a version the
    # stream never reached is "stands for version 12, but the stream's events end at version 9")
    assert (
        f"problem: snapshot of {snapshotted.victim} at version 12: does not read back: snapshot: its seal"
        " does not match"
    ) in result.stderr


def test_snapshots_in_memory_equal_their_folds() -> None:
    with Engine(settings=make_settings(database_url="memory:", snapshot_interval=3)) as engine:
        engine.start_session("s", "wf", user_id="u")
        for n in range(10):
            engine.record_step("s", f"step-{n}", context_update={"n": n})
        streams = engine.log.snapshotted_streams()
        assert streams == [engine.session_uuid("s")]
        assert verify_snapshots(engine.log, streams) == []


def _sql(snapshotted: Snapshotted, statement: str) -> None:
    with psycopg.connect(snapshotted.url, autocommit=True) as conn:
        conn.execute(
            SQL(statement).format(events=Identifier(snapshotted.schema, "flowledger_events")),
            (snapshotted.victim,),
        )


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("DELETE FROM {events} WHERE originator_id = %s AND originator_version = 3", "deleted"),
        (
            "UPDATE {events} SET state = 'not json' WHERE originator_id = %s AND originator_version = 3",
            "altered",
        ),
    ],
    ids=["a-middle-event-deleted", "an-event-that-does-not-decode"],
)
def test_a_stream_whose_events_do_not_fold_is_named_not_a_crash(
    snapshotted: Snapshotted, statement: str, kind: str
) -> None:
    # Given a snapshotted stream with an event before its snapshots deleted, or unreadable
    _sql(snapshotted, statement)
    # When it is verified
    result = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify", "--session", "victim")
    # Then the chain's finding is named, and the snapshots are said not to be compared (exit 1,
    # not exit 65 or 70 from folding the stream)
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert problems[0].startswith(f"problem: {kind}: stream {snapshotted.victim}"), problems
    assert (
        f"problem: snapshots of {snapshotted.victim}: not compared, its events do not fold" in result.stderr
    )
