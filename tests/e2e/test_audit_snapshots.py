"""A snapshot edited in the database so that it still reads back: ``flowledger audit verify``
names it, as it names an edited event (snapshots are not chained, but a load starts from them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from tests.conftest import make_settings
from tests.support.cli import run_cli


@dataclass
class Snapshotted:
    url: str
    schema: str
    victim: UUID

    def edit_snapshot(self, version: int, **fields: Any) -> None:
        table = Identifier(self.schema, "flowledger_snapshots")
        with psycopg.connect(self.url, autocommit=True) as conn:
            ((state,),) = conn.execute(
                SQL("SELECT state FROM {} WHERE originator_id = %s AND originator_version = %s").format(
                    table
                ),
                (self.victim, version),
            ).fetchall()
            payload = json.loads(bytes(state))
            payload["state"].update(fields)
            conn.execute(
                SQL("UPDATE {} SET state = %s WHERE originator_id = %s AND originator_version = %s").format(
                    table
                ),
                (json.dumps(payload, separators=(",", ":")).encode(), self.victim, version),
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
        yield Snapshotted(database_url, pg_schema, engine.session_uuid("victim"))


def test_an_untouched_snapshotted_log_verifies(snapshotted: Snapshotted) -> None:
    result = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify")
    assert result.returncode == 0, result.stderr
    assert "18 events in 2 streams: ok" in result.stderr


def test_audit_verify_names_a_snapshot_edited_so_that_it_still_reads_back(snapshotted: Snapshotted) -> None:
    # Given the victim's latest snapshot edited: another user, a hundred times the steps
    snapshotted.edit_snapshot(8, user_id="mallory", step_count=700)
    # When the whole log, or the victim's session alone, is verified
    whole = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify")
    alone = run_cli(snapshotted.url, snapshotted.schema, "audit", "verify", "--session", "victim")
    # Then both exit 1 naming the snapshot, its stream and version and the fields that differ
    for result in (whole, alone):
        assert result.returncode == 1, result.stderr
        problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
        assert problems == [
            f"problem: snapshot of {snapshotted.victim} at version 8: altered: step_count, user_id"
            " differ from its events folded to that version"
        ]


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
    assert (
        f"problem: snapshot of {snapshotted.victim} at version 12: stands for version 12, but the"
        " stream's events end at version 9"
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
