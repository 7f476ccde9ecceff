"""Retention that keeps proof (docs/retention.md): closed sessions older than their workflow's
policy move to verified bundles, their rows go, their state, totals, projections and the audit
chain stay; a bundle restores them exactly, and a tampered one is refused."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from fastapi.testclient import TestClient
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.domain.errors import (
    ArchivedBaseForged,
    AuditError,
    IdempotencyKeyOfAnotherKind,
    SessionArchived,
    SessionExpired,
    SessionNotFound,
    StoredEventMissing,
    StoredEventUnreadable,
    ValidationError,
)
from flowledger.domain.session_window import RECENT_STEPS
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import verify_log
from flowledger.infrastructure.audit_keys import rotate_signing_key
from flowledger.infrastructure.engine import retention as retention_module
from flowledger.infrastructure.engine.erasure import ErasureService
from flowledger.infrastructure.engine.retention import RestoreReport, RetentionService
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.retention import RetentionTables
from flowledger.infrastructure.postgres.snapshot_seal import stripped
from flowledger.projections import Projector, archived, projector_for, recent_dead_letters, status
from flowledger.projections.rebuild import rebuild, verify
from flowledger.projections.retention import archive, restore
from flowledger.verify import verify_bundle
from tests.conftest import TEST_KEY_DIR, make_settings
from tests.integration.conftest import CLOCK_START
from tests.support.cli import run_cli
from tests.support.clock import SetClock
from tests.support.partitions import both_layouts

BOTH_LAYOUTS = {
    "test_archive_verify_rebuild_restore",
    "test_archived_session_written_again_chains_from_its_base",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The tests that delete and put back rows run on the one-table and the partitioned log."""
    if metafunc.function.__name__ in BOTH_LAYOUTS:
        both_layouts(metafunc)


WORKFLOW = "customer_service"
START = CLOCK_START


def usage(n: int) -> LlmUsage:
    return LlmUsage(
        provider="openai",
        request_model="gpt-4.1" if n % 2 else "gpt-4.1-mini",
        input_tokens=100 + n,
        output_tokens=20 + n,
        cost_usd=Decimal("0.0012") + Decimal(n) / 10_000,
        latency_ms=300.0 + n,
    )


@pytest.fixture
def engine(clocked_engine: Engine) -> Engine:
    return clocked_engine


def _session(engine: Engine, session_id: str, *, steps: int = 5, close: str | None = "complete") -> None:
    engine.start_session(session_id, WORKFLOW, user_id=f"user-{session_id}", metadata={"channel": "chat"})
    for n in range(steps):
        engine.record_step(
            session_id,
            f"step_{n}",
            input={"message": f"hello {n}"},
            output={"reply": f"answer {n}"},
            context_update={"turn": n},
            usage=usage(n),
            idempotency_key=f"{session_id}-{n}",
        )
    if close == "complete":
        engine.complete_session(session_id, {"summary": f"done {session_id}"})
    elif close == "abandon":
        engine.abandon_session(session_id, "user left")


def _rows(engine: Engine, session_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(engine.database_url) as conn:
        return conn.execute(
            SQL(
                "SELECT originator_version, topic, state, notification_id, event_hash, event_mac"
                " FROM {}.flowledger_events WHERE originator_id = %s ORDER BY originator_version"
            ).format(Identifier(engine.settings.schema)),
            [engine.session_uuid(session_id)],
        ).fetchall()


def _dashboard(engine: Engine) -> list[tuple[Any, ...]]:
    """The cost dashboard's totals per workflow, step and model, and the sessions' totals."""
    reader = f"{engine.settings.schema}_read"
    with psycopg.connect(engine.database_url) as conn:
        calls = conn.execute(
            SQL(
                "SELECT workflow, step, model, sum(calls), sum(input_tokens), sum(output_tokens),"
                " sum(cost_usd)"
                " FROM {}.cost_rollups WHERE grain = 'day' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
            ).format(Identifier(reader))
        ).fetchall()
        sessions = conn.execute(
            SQL(
                "SELECT session_id, status, step_count, calls, input_tokens, output_tokens, cost_usd"
                " FROM {}.sessions ORDER BY session_id"
            ).format(Identifier(reader))
        ).fetchall()
        funnel = conn.execute(
            SQL("SELECT workflow, step, count(*) FROM {}.funnel_steps GROUP BY 1, 2 ORDER BY 1, 2").format(
                Identifier(reader)
            )
        ).fetchall()
    return [*calls, *sessions, *funnel]


def test_archive_verify_rebuild_restore(engine: Engine, clock: SetClock, tmp_path: Path) -> None:
    projector = projector_for(engine)
    _session(engine, "old-done")
    _session(engine, "old-left", steps=3, close="abandon")
    _session(engine, "old-open", steps=2, close=None)  # never closed: kept
    clock.now = START + timedelta(days=80)
    _session(engine, "young-done", steps=2)  # closed 20 days before the run: kept
    _session(engine, "other-flow", steps=1, close=None)
    clock.now = START + timedelta(days=100)
    engine.retention.set_policy(WORKFLOW, 90)
    rebuild(projector)
    before = {s: engine.get_session(s) for s in ("old-done", "old-left")}
    rows_before = {s: _rows(engine, s) for s in ("old-done", "old-left")}
    dashboard = _dashboard(engine)

    dry = archive(engine, projector, tmp_path / "dry", dry_run=True)
    assert sorted(dry.workflows[0].sessions) == ["old-done", "old-left"]
    assert dry.events == len(rows_before["old-done"]) + len(rows_before["old-left"])
    assert not (tmp_path / "dry").exists()
    assert _rows(engine, "old-done") == rows_before["old-done"]

    report = archive(engine, projector, tmp_path / "archive")
    assert sorted(report.workflows[0].sessions) == ["old-done", "old-left"]
    assert report.events == dry.events
    [bundle] = report.workflows[0].bundles
    assert _rows(engine, "old-done") == []
    assert _rows(engine, "old-left") == []
    for kept in ("old-open", "young-done"):
        assert _rows(engine, kept), kept

    # The bundle verifies offline; the chain verifies with the rows gone.
    assert verify_bundle(Path(bundle).read_text().splitlines(), engine.audit.signing.public_bytes).ok
    chain = verify_chain(engine.audit)
    assert chain.ok, [f.describe() for f in chain.findings]
    assert chain.archived == 2

    # State reads from the base; the dashboard and a rebuild keep the totals.
    for session_id, state in before.items():
        assert engine.get_session(session_id) == state
        with pytest.raises(SessionArchived):
            engine.history(session_id)
    assert _dashboard(engine) == dashboard
    rebuild(projector)
    assert _dashboard(engine) == dashboard
    assert verify(projector) == []

    # A second run finds nothing more to do.
    assert archive(engine, projector, tmp_path / "archive").sessions == 0

    restored = engine.restore_sessions(bundle)
    assert sorted(restored.sessions) == ["old-done", "old-left"]
    for session_id, rows in rows_before.items():
        assert _rows(engine, session_id) == rows
        assert engine.get_session(session_id) == before[session_id]
    assert verify_chain(engine.audit).ok
    rebuild(projector)
    assert _dashboard(engine) == dashboard
    assert verify(projector) == []
    again = engine.restore_sessions(bundle, ["old-done"])  # not archived any more: restored already
    assert again.sessions == ()
    assert again.skipped[str(engine.session_uuid("old-done"))].startswith("restored already")


def test_a_session_with_a_snapshot_at_its_last_version_is_archived_and_archived_again(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given a closed session whose last version (6) the engine snapshotted (every 3 here),
    # beside one whose last version (5) it did not
    _session(engine, "on-six", steps=4)
    _session(engine, "on-five", steps=3)
    assert engine.get_session("on-six").version % 3 == 0
    clock.now = START + timedelta(days=100)
    engine.retention.set_policy(WORKFLOW, 90)
    projector = projector_for(engine)
    rebuild(projector)
    before = {s: engine.get_session(s) for s in ("on-six", "on-five")}
    # When retention runs, Then both are archived (the snapshot there already is kept)
    report = archive(engine, projector, tmp_path / "first")
    assert sorted(report.workflows[0].sessions) == ["on-five", "on-six"]
    assert {s: engine.get_session(s) for s in before} == before
    # And after a restore (which leaves the archive's snapshots), a second run archives them again
    [bundle] = report.workflows[0].bundles
    engine.restore_sessions(bundle)
    again = archive(engine, projector, tmp_path / "second")
    assert sorted(again.workflows[0].sessions) == ["on-five", "on-six"]
    assert {s: engine.get_session(s) for s in before} == before
    chain = verify_chain(engine.audit)
    assert chain.ok, [f.describe() for f in chain.findings]


def _archived_bundle(engine: Engine, clock: SetClock, tmp_path: Path) -> str:
    """Archive one closed session, s-1, ten days later under a 7-day policy: its bundle."""
    _session(engine, "s-1")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = archive(engine, projector_for(engine), tmp_path).workflows[0].bundles
    return bundle


def test_tampered_bundle_and_base_are_refused(engine: Engine, clock: SetClock, tmp_path: Path) -> None:
    bundle = _archived_bundle(engine, clock, tmp_path)
    records = [json.loads(line) for line in Path(bundle).read_text().splitlines()]
    for record in records:
        if record["type"] == "event" and record["version"] == 2:
            record["state"] = record["state"].replace("hello 0", "hello X")
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(AuditError, match="does not verify"):
        engine.restore_sessions(tampered)
    assert _rows(engine, "s-1") == []

    # A base edited in the database is a finding, and is not restored from.
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL("UPDATE {}.flowledger_retention_bases SET totals = totals || '{{\"calls\": 0}}'").format(
                Identifier(engine.settings.schema)
            )
        )
    findings = verify_chain(engine.audit).findings
    # The base does not count: the rows it stood for are missing too.
    assert [(f.kind, f.name) for f in findings] == [("forged", "s-1"), ("deleted", None)]
    with pytest.raises(AuditError, match="not sealed"):
        engine.restore_sessions(bundle)


def test_a_bundle_that_verifies_but_is_not_the_archived_file_is_refused(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session, and its bundle written out again record by record: every
    # event and proof the same (it still verifies), the bytes not (compact JSON)
    bundle = _archived_bundle(engine, clock, tmp_path)
    records = [json.loads(line) for line in Path(bundle).read_text().splitlines()]
    rewritten = tmp_path / "rewritten.jsonl"
    rewritten.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    assert rewritten.read_bytes() != Path(bundle).read_bytes()
    # When it is restored from, Then the base's SHA-256 refuses it, naming the archived file
    with pytest.raises(AuditError, match=rf"not the file it was archived to \({Path(bundle).name}"):
        engine.restore_sessions(rewritten)
    assert _rows(engine, "s-1") == []
    # And the archived file itself restores
    assert engine.restore_sessions(bundle).sessions == ("s-1",)
    assert len(_rows(engine, "s-1")) > 0


def test_a_cost_edited_in_a_bases_projection_rows_is_named(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session whose base keeps its dashboard rows (a rebuild reads them)
    _archived_bundle(engine, clock, tmp_path)
    assert verify_chain(engine.audit).ok
    # When a cost in those rows is edited in the database (what a rebuild would then show)
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL(
                "UPDATE {}.flowledger_retention_bases"
                " SET projection_rows = replace(projection_rows::text, %s, %s)::jsonb"
            ).format(Identifier(engine.settings.schema)),
            ['"cost_usd": 0.0012', '"cost_usd": 99.5'],
        )
        changed = conn.execute(
            SQL("SELECT projection_rows::text LIKE '%99.5%' FROM {}.flowledger_retention_bases").format(
                Identifier(engine.settings.schema)
            )
        ).fetchone()
    assert changed == (True,)
    # Then audit verify names the base as forged (its seal covers the rows), saying plainly that
    # it was altered, and the stream its base no longer proves as deleted (it said "gone")
    findings = verify_chain(engine.audit).findings
    assert [(f.kind, f.name) for f in findings] == [("forged", "s-1"), ("deleted", None)]
    assert findings[0].detail.startswith(
        "its retention base does not match its seal: altered in the database"
    )
    assert findings[1].detail.startswith("dropped rows: the whole stream was deleted")


def _edit_costs(engine: Engine, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in every base's projection rows, in SQL (as an intruder would)."""
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL(
                "UPDATE {}.flowledger_retention_bases"
                " SET projection_rows = replace(projection_rows::text, %s, %s)::jsonb"
            ).format(Identifier(engine.settings.schema)),
            [old, new],
        )


def test_a_rebuild_refuses_a_base_whose_projection_rows_were_edited(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session (s-1) and an open one, projected; then a cost in the archived
    # session's base edited in the database (0.0012 -> 5.55)
    _archived_bundle(engine, clock, tmp_path)
    _session(engine, "s-2", steps=2, close=None)
    projector = projector_for(engine)
    projector.catch_up()
    before = _dashboard(engine)
    _edit_costs(engine, '"cost_usd": 0.0012', '"cost_usd": 5.55')
    # When the projections are rebuilt (or verified against a scratch rebuild)
    with pytest.raises(ArchivedBaseForged) as raised:
        rebuild(projector)
    # Then the error names the session and its stream (before: exit 0, the dashboard at 5.55)
    stream = str(engine.session_uuid("s-1"))
    assert (raised.value.session_id, raised.value.stream) == ("s-1", stream)
    assert f"archived session 's-1' (stream {stream}" in str(raised.value)
    assert "does not match its seal" in str(raised.value)
    with pytest.raises(ArchivedBaseForged):
        verify(projector)
    # And nothing is half-written: the readers keep their builds, no other build is left
    assert _dashboard(engine) == before
    assert {b.state for b in status(projector)} == {"live"}
    # And with the rows put back as sealed, the rebuild goes through and shows the same totals
    _edit_costs(engine, '"cost_usd": 5.55', '"cost_usd": 0.0012')
    rebuild(projector)
    assert _dashboard(engine) == before
    assert verify(projector) == []


def test_a_rebuild_checks_the_bases_seals_once_for_all_its_projections(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an archived session, whose base every projection folds into its new build
    _archived_bundle(engine, clock, tmp_path)
    projector = projector_for(engine)
    projector.catch_up()
    before = _dashboard(engine)
    checks: list[str] = []
    check = archived._check_seals

    def counted(*args: Any, **kwargs: Any) -> None:
        checks.append("checked")
        check(*args, **kwargs)

    monkeypatch.setattr(archived, "_check_seals", counted)
    # When every projection is rebuilt
    rebuild(projector)
    # Then the seals were checked once (before: once per projection), and the rows folded
    assert len(projector.projections) > 1
    assert checks == ["checked"]
    assert _dashboard(engine) == before


def test_the_edited_base_among_several_is_the_one_named(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three archived sessions, their bases checked one at a time, and only s-3's edited
    for session_id in ("s-1", "s-2", "s-3"):
        _session(engine, session_id, steps=2)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    assert archive(engine, projector_for(engine), tmp_path).sessions == 3
    monkeypatch.setattr(archived, "CHECK_BATCH", 1)
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL(
                "UPDATE {}.flowledger_retention_bases"
                " SET projection_rows = replace(projection_rows::text, %s, %s)::jsonb WHERE session_id = %s"
            ).format(Identifier(engine.settings.schema)),
            ['"cost_usd": 0.0012', '"cost_usd": 5.55', "s-3"],
        )
    # When rebuilt, Then the error names s-3, not the sessions whose bases check
    with pytest.raises(ArchivedBaseForged) as raised:
        rebuild(projector_for(engine))
    assert raised.value.session_id == "s-3"


def test_a_cli_rebuild_over_an_edited_base_exits_65_naming_the_session(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session whose base's rows were edited in the database
    _archived_bundle(engine, clock, tmp_path)
    projector_for(engine).catch_up()
    before = _dashboard(engine)
    _edit_costs(engine, '"cost_usd": 0.0012', '"cost_usd": 5.55')
    # When `flowledger projections rebuild` runs with the engine's chain key
    keys = {"FLOWLEDGER_AUDIT_KEY_DIR": str(TEST_KEY_DIR)}
    result = run_cli(engine.database_url, engine.settings.schema, "projections", "rebuild", env=keys)
    # Then it exits 65 (bad data, as for a deleted row) with one line naming the session
    assert result.returncode == 65, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "archived session 's-1'" in line
    assert "does not match its seal" in line
    assert _dashboard(engine) == before


def test_a_rebuild_without_the_chain_key_folds_no_base(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session with its base intact
    _archived_bundle(engine, clock, tmp_path)
    projector_for(engine).catch_up()
    before = _dashboard(engine)
    # When a projector built without the chain key rebuilds: refused, nothing changed
    keyless = projector_for(engine)
    keyless.chain_key = None
    with pytest.raises(ValidationError) as raised:
        rebuild(keyless)
    assert raised.value.field == "chain_key"
    assert _dashboard(engine) == before
    # And a CLI process whose key directory holds another key (a new one is made there on
    # first use) cannot prove the base either: refused as forged, nothing changed
    other = {"FLOWLEDGER_AUDIT_KEY_DIR": str(tmp_path / "other-keys")}
    result = run_cli(engine.database_url, engine.settings.schema, "projections", "rebuild", env=other)
    assert result.returncode == 65, result.stderr
    assert "archived session 's-1'" in result.stderr
    assert _dashboard(engine) == before


def test_a_base_sealed_before_its_rows_were_sealed_still_verifies(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given a base as an earlier version sealed it (over every field but the projection rows)
    _archived_bundle(engine, clock, tmp_path)
    projector: Projector = projector_for(engine)
    projector.catch_up()
    before = _dashboard(engine)
    tables = RetentionTables(engine.settings.schema)
    with psycopg.connect(engine.database_url) as conn:
        [stored] = tables.bases(conn, engine.audit.chain_key).values()
        legacy = replace(stored.base, projection_rows_sha256=None).seal(engine.audit.chain_key)
        conn.execute(
            SQL("UPDATE {}.flowledger_retention_bases SET seal = %s").format(
                Identifier(engine.settings.schema)
            ),
            [legacy],
        )
    # Then it is still a valid base
    report = verify_chain(engine.audit)
    assert report.ok, [f.describe() for f in report.findings]
    assert report.archived == 1
    # And a rebuild still takes its rows (unproven by the seal: docs/retention.md)
    rebuild(projector)
    assert _dashboard(engine) == before


def test_rows_deleted_without_a_base_are_still_found(engine: Engine) -> None:
    _session(engine, "s-1", steps=1)
    engine.audit.checkpoint()
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL("DELETE FROM {}.flowledger_events WHERE originator_id = %s").format(
                Identifier(engine.settings.schema)
            ),
            [engine.session_uuid("s-1")],
        )
    assert [f.kind for f in verify_chain(engine.audit).findings] == ["deleted"]


def test_archived_session_written_again_chains_from_its_base(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    engine.start_session("s-1", WORKFLOW, user_id="u-1", ttl=timedelta(hours=1))
    engine.record_step("s-1", "greet", input={"m": 1}, usage=usage(1))
    clock.now = START + timedelta(days=2)
    with pytest.raises(SessionExpired):
        engine.record_step("s-1", "late", input={"m": 2})  # records Expired first
    clock.now = START + timedelta(days=5)
    engine.audit.checkpoint()  # signs the head the base keeps: the checkpoint after must build on it
    engine.retention.set_policy(WORKFLOW, 1)
    report = engine.archive_sessions(tmp_path)
    assert report.sessions == 1
    [bundle] = report.workflows[0].bundles
    archived = engine.get_session("s-1")
    assert archived.status == "expired"
    with pytest.raises(SessionArchived, match=str(bundle)):
        engine.history("s-1")

    # Taken back to init: the new event chains from the base's head.
    engine.restart_session("s-1", WORKFLOW, user_id="u-1")
    assert engine.get_session("s-1").version == archived.version + 1
    engine.audit.checkpoint()
    chain = verify_chain(engine.audit)
    assert chain.ok, [f.describe() for f in chain.findings]
    assert verify_log(engine.log, archived=engine.retention.archived()).ok
    assert not verify_log(engine.log).ok  # without the bases, the stream starts at a gap
    # A rebuild checks the new event's hash from the base's head too: nothing is set aside
    projector = projector_for(engine)
    rebuild(projector)
    assert recent_dead_letters(projector) == []
    # ... and one edited there is set aside
    with psycopg.connect(engine.database_url) as conn:
        stored = SQL("{}.flowledger_events").format(Identifier(engine.settings.schema))
        edit = SQL(
            "UPDATE {} SET state = convert_to(replace(convert_from(state, 'UTF8'), 'u-1', 'u-2'), 'UTF8')"
            " WHERE originator_id = %s AND originator_version = %s"
        ).format(stored)
        assert conn.execute(edit, [engine.session_uuid("s-1"), archived.version + 1]).rowcount == 1
    rebuild(projector)
    assert {(d.originator_version, d.error.split(":")[0]) for d in recent_dead_letters(projector)} == {
        (archived.version + 1, "StoredEventAltered")
    }
    with psycopg.connect(engine.database_url) as conn:
        undo = SQL(
            "UPDATE {} SET state = convert_to(replace(convert_from(state, 'UTF8'), 'u-2', 'u-1'), 'UTF8')"
            " WHERE originator_id = %s AND originator_version = %s"
        ).format(stored)
        conn.execute(undo, [engine.session_uuid("s-1"), archived.version + 1])
    # ... and restoring the archived part gives back one whole stream.
    engine.restore_sessions(bundle)
    assert [e.version for e in engine.history("s-1")] == list(range(1, archived.version + 2))
    assert verify_chain(engine.audit).ok
    assert verify_log(engine.log, archived=engine.retention.archived()).ok


def test_an_archived_session_written_again_reads_as_archived_not_as_tampered(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """An expired session archived, then restarted: its rows start after its base. `flowledger
    history` of it exited 65, "a stored event is missing: stream … version 1 (the next stored is
    7) (changed in the database? …)", a false alarm of tampering, and so did session_steps and a
    replay as of a moment in its archived part (the webhook's step list with them). Each is now
    SessionArchived naming the bundle (exit 3), as before the restart; a row deleted after the
    base is still named missing."""
    engine.start_session("s-1", WORKFLOW, user_id="u-1", ttl=timedelta(hours=1))
    for n in range(4):
        engine.record_step("s-1", f"step_{n}", input={"n": n}, usage=usage(n))
    clock.now = START + timedelta(days=2)
    assert engine.expire_session("s-1")
    clock.now = START + timedelta(days=5)
    engine.retention.set_policy(WORKFLOW, 1)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    engine.restart_session("s-1", WORKFLOW, user_id="u-1")
    engine.record_step("s-1", "again", input={}, usage=usage(9))
    for read in (
        lambda: engine.history("s-1"),
        lambda: engine.session_steps("s-1"),
        lambda: engine.get_session("s-1", as_of=START + timedelta(minutes=1)),
    ):
        with pytest.raises(SessionArchived) as refused:
            read()
        assert refused.value.bundle == bundle
    result = run_cli(engine.database_url, engine.settings.schema, "history", "s-1")
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: session 's-1' was archived: its events are in"), result.stderr
    with psycopg.connect(engine.database_url) as conn:  # an intruder deletes the restart
        conn.execute(
            SQL(
                "DELETE FROM {}.flowledger_events WHERE originator_id = %s AND originator_version = 7"
            ).format(Identifier(engine.settings.schema)),
            [engine.session_uuid("s-1")],
        )
    with pytest.raises(StoredEventMissing):
        engine.history("s-1")
    engine.restore_sessions(bundle)
    with pytest.raises(StoredEventMissing, match="version 7"):
        engine.history("s-1")


def test_bad_policies_are_refused(engine: Engine, tmp_path: Path) -> None:
    assert engine.retention.policies() == {}
    assert engine.archive_sessions(tmp_path, dry_run=True).workflows == []
    with pytest.raises(ValidationError, match="days"):
        engine.retention.set_policy(WORKFLOW, 0)
    with pytest.raises(ValidationError, match="no retention policy"):
        engine.archive_sessions(tmp_path, workflow="nope")
    with pytest.raises(ValidationError, match="cannot read"):
        engine.restore_sessions(tmp_path / "missing.jsonl")


def test_a_run_with_nothing_due_leaves_no_directory_behind(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    _session(engine, "young-done", steps=2)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 90)
    report = engine.archive_sessions(tmp_path / "new" / "archive")
    assert report.events == 0
    assert not (tmp_path / "new").exists()  # nor the parent it made
    kept = tmp_path / "kept"
    kept.mkdir()
    engine.archive_sessions(kept)
    assert kept.is_dir()  # a directory that was there before stays
    clock.now = START + timedelta(days=100)
    report = engine.archive_sessions(tmp_path / "new" / "archive")
    assert report.events > 0
    assert len(list((tmp_path / "new" / "archive").iterdir())) == 1


def test_forgetting_an_archived_session_asks_for_a_restore(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path, quick_purge: None
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings, clock=clock) as engine:
        _session(engine, "s-1", steps=1)
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
        with pytest.raises(ValidationError, match="retention restore"):
            engine.forget("user-s-1")
        engine.restore_sessions(bundle)
        assert engine.forget("user-s-1").sessions == ("s-1",)


def test_forgetting_a_session_whose_fork_is_archived_asks_for_a_restore(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path, quick_purge: None
) -> None:
    """``forget --session P`` erases P's forks too (each holds a copy of P's context), found by
    their ``Forked`` events in the log. A fork archived by retention has none there: an outside
    probe erased P ("erased 1 sessions") while the archived fork still read ``{'card': '4111'}``,
    its key kept. Its base's snapshot names its parent: the fork is found and refused as archived."""
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings, clock=clock) as engine:
        engine.start_session("p", WORKFLOW)
        engine.record_step("p", "collect", input={}, output={}, context_update={"card": "4111"})
        engine.fork_session("p", engine.get_session("p").version, "f")
        engine.fork_session("f", engine.get_session("f").version, "ff")
        for fork in ("f", "ff"):
            engine.complete_session(fork, {"ok": True})
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles  # the forks, not "p" (open)
        with pytest.raises(ValidationError, match=r"2 of the sessions are archived .*retention restore"):
            engine.forget_session("p")
        assert engine.get_session("p").context == {"card": "4111"}  # nothing erased
        engine.restore_sessions(bundle)
        assert sorted(engine.forget_session("p").sessions) == ["f", "ff", "p"]
        for session_id in ("p", "f", "ff"):
            assert "4111" not in json.dumps(engine.get_session(session_id).context)


def test_a_retry_of_an_old_keyed_step_of_an_archived_session_is_not_recorded_again(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A key older than the state's recent steps is looked for in the stored events; an archived
    session has none. An outside probe: 25 keyed steps, expired, archived, restarted, then a retry
    of the first step's key recorded it a second time (steps 25 -> 26, cost $0.0600 -> $0.0612);
    before archiving, the same retry was answered with the recorded step. Now it is refused naming
    the bundle, and answered after the restore."""
    engine.start_session("s-1", WORKFLOW, user_id="u-1", ttl=timedelta(hours=1))
    first = engine.record_step("s-1", "step_0", input={"n": 0}, usage=usage(0), idempotency_key="k-0")
    for n in range(1, RECENT_STEPS + 1):  # pushes k-0 out of the recent window
        engine.record_step("s-1", f"step_{n}", input={"n": n}, usage=usage(n), idempotency_key=f"k-{n}")
    clock.now = START + timedelta(days=2)
    assert engine.expire_session("s-1")
    clock.now = START + timedelta(days=5)
    engine.retention.set_policy(WORKFLOW, 1)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    engine.restart_session("s-1", WORKFLOW, user_id="u-1")
    totals = engine.get_session("s-1").totals

    def retry() -> Any:
        return engine.record_step("s-1", "step_0", input={"n": 0}, usage=usage(0), idempotency_key="k-0")

    with pytest.raises(SessionArchived, match="idempotency key 'k-0' may be among its events") as refused:
        retry()
    assert refused.value.bundle == bundle
    with TestClient(create_app(engine)) as client:  # said over HTTP too, the bundle by its file name
        answer = client.post(
            "/v1/sessions/s-1/steps",
            json={"step": "step_0", "input": {"n": 0}, "idempotency_key": "k-0"},
        )
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == (
        f"session 's-1' was archived: the step under idempotency key 'k-0' may be among its events, in the"
        f" bundle {Path(bundle).name} (an operator puts them back with `flowledger retention restore`)"
    )
    assert engine.get_session("s-1").totals == totals  # nothing recorded
    # A recent key is answered from the state, a new key is recorded, as before
    assert (
        engine.record_step("s-1", "step_20", input={"n": 20}, usage=usage(20), idempotency_key="k-20").step
        == "step_20"
    )
    engine.restore_sessions(bundle)
    assert retry() == first
    assert engine.get_session("s-1").totals == totals


def test_a_retry_of_a_keyed_context_update_or_extension_of_an_archived_session_is_not_applied_again(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """Keyed context updates and expiry changes are found by searching the stored events. An
    outside probe: a session's update {"n": 1} under key ctx-1, expired, archived, restarted,
    updated to {"n": 2}; the retry of ctx-1 applied {"n": 1} again over it (version 27 -> 28),
    where unarchived it is answered as the session stands. Now both are refused naming the bundle."""
    engine.start_session("s-1", WORKFLOW, user_id="u-1", ttl=timedelta(hours=1))
    engine.update_context("s-1", {"n": 1}, idempotency_key="ctx-1")
    engine.extend_session("s-1", timedelta(hours=1), idempotency_key="ext-1")
    clock.now = START + timedelta(days=2)
    assert engine.expire_session("s-1")
    clock.now = START + timedelta(days=5)
    engine.retention.set_policy(WORKFLOW, 1)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    engine.restart_session("s-1", WORKFLOW, user_id="u-1")
    engine.update_context("s-1", {"n": 2})
    state = engine.get_session("s-1")
    for retry, what in (
        (lambda: engine.update_context("s-1", {"n": 1}, idempotency_key="ctx-1"), "context update"),
        (lambda: engine.extend_session("s-1", timedelta(hours=1), idempotency_key="ext-1"), "expiry change"),
    ):
        with pytest.raises(SessionArchived, match=f"the {what} under idempotency key") as refused:
            retry()
        assert refused.value.bundle == bundle
    assert engine.get_session("s-1") == state  # nothing applied
    engine.restore_sessions(bundle)
    assert engine.update_context("s-1", {"n": 1}, idempotency_key="ctx-1").context == {"n": 2}
    assert engine.get_session("s-1").version == state.version


def test_a_keyed_context_update_under_a_new_key_of_an_archived_session_needs_no_restore(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """An outside probe: a session updated under ctx-1, expired, archived (flowledger retention
    run), restarted (the webhook's create_session); PATCH /v1/sessions/a1/context under the new
    key fresh-1 answered 404 'the context update under idempotency key 'fresh-1' may be among
    its events', as did every keyed update until a restore. The base's key filter (state
    version 7) holds every key the archived events used: one it rules out is new."""
    # Given a session updated under ctx-1 and stepped under k-0, archived and restarted
    engine.start_session("s-1", WORKFLOW, user_id="u-1", ttl=timedelta(hours=1))
    engine.update_context("s-1", {"n": 1}, idempotency_key="ctx-1")
    engine.record_step("s-1", "a", input={}, output={}, idempotency_key="k-0")
    clock.now = START + timedelta(days=2)
    assert engine.expire_session("s-1")
    clock.now = START + timedelta(days=5)
    engine.retention.set_policy(WORKFLOW, 1)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    engine.restart_session("s-1", WORKFLOW, user_id="u-1")
    # When it is updated under a new key, and that update is sent again
    updated = engine.update_context("s-1", {"n": 2}, idempotency_key="fresh-1")
    again = engine.update_context("s-1", {"n": 2}, idempotency_key="fresh-1")
    # Then the update is applied once, without a restore
    assert (updated.context, again.version) == ({"n": 2}, updated.version)
    # And the archived update's key is still refused, for an update or a step, naming the bundle
    for retry in (
        lambda: engine.update_context("s-1", {"n": 1}, idempotency_key="ctx-1"),
        lambda: engine.record_step("s-1", "b", input={}, output={}, idempotency_key="ctx-1"),
    ):
        with pytest.raises(SessionArchived) as refused:
            retry()
        assert refused.value.bundle == bundle
    # And the step's key, in the state's recent window, is refused as the step's
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names step 'a'"):
        engine.update_context("s-1", {"n": 3}, idempotency_key="k-0")
    # And a step under the new update's key is refused as the update's, from the stored events
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update"):
        engine.record_step("s-1", "b", input={}, output={}, idempotency_key="fresh-1")
    assert engine.get_session("s-1").version == updated.version


def test_a_replay_or_fork_before_an_archived_sessions_head_names_its_bundle(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given a session of 5 events (start, 3 steps, complete) archived by its policy
    _session(engine, "s-old", steps=3)
    head = engine.get_session("s-old")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    # When it is read at its head, or as of a moment at or after its last event, that is its
    # base's state
    assert engine.get_session("s-old", version=head.version) == head
    assert engine.get_session("s-old", as_of=head.updated_at) == head
    assert engine.get_session("s-old", as_of=START + timedelta(days=9)) == head
    # Then a replay at an earlier version or a time, and a fork from an earlier version, need the
    # events: each says where they are (exit 3 / 404 as not found), not that the session is unknown
    for read in (
        lambda: engine.get_session("s-old", version=2),
        lambda: engine.get_session("s-old", as_of=head.updated_at - timedelta(microseconds=1)),
        lambda: engine.fork_session("s-old", 2, "s-old-fork"),
    ):
        with pytest.raises(SessionArchived) as refused:
            read()
        assert refused.value.bundle == bundle
    # and the fork appended nothing
    with pytest.raises(SessionNotFound, match="s-old-fork' not found"):
        engine.get_session("s-old-fork")
    engine.restore_sessions(bundle)
    assert engine.get_session("s-old", version=2).step_count == 1


def test_a_version_past_an_archived_sessions_older_snapshot_names_its_bundle(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """The engine snapshots every 3 events, and those snapshots stay when the events go: a replay
    at version 4 of an archived session of 9 versions read the snapshot at 3 and said "session has
    3 versions, not 4" (ValidationError: exit 2, HTTP 422), and a fork at 5 likewise. It is now
    SessionArchived naming the bundle, as at versions 1 and 2; a snapshot's own version reads."""
    _session(engine, "s-old", steps=7)  # start, 7 steps, complete: 9 versions
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    assert engine.get_session("s-old").version == 9
    for read in (
        lambda: engine.get_session("s-old", version=4),
        lambda: engine.get_session("s-old", version=8),
        lambda: engine.fork_session("s-old", 5, "s-fork"),
    ):
        with pytest.raises(SessionArchived) as refused:
            read()
        assert refused.value.bundle == bundle
    assert engine.get_session("s-old", version=3).step_count == 2  # the engine's snapshot there
    with pytest.raises(ValidationError, match="session has 9 versions, not 10"):
        engine.get_session("s-old", version=10)
    result = run_cli(engine.database_url, engine.settings.schema, "replay", "s-old", "--version", "4")
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: session 's-old' was archived: its events are in"), result.stderr


def test_a_restore_of_one_session_run_twice_is_harmless(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A restore run twice is harmless (docs/retention.md): the whole bundle's second run says
    "restored already", exit 0. With --session, the second run (a script's retry after a lost
    answer) said "session: none of ['s-1'] is archived in BUNDLE", exit 2. It is now the same
    report, exit 0; a session the bundle does not hold is still refused."""
    _session(engine, "s-1", steps=1)
    _session(engine, "s-2", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    assert engine.restore_sessions(bundle, ["s-1"]).sessions == ("s-1",)
    again = engine.restore_sessions(bundle, ["s-1"])
    assert again.sessions == ()
    assert again.skipped[str(engine.session_uuid("s-1"))].startswith("restored already")
    result = run_cli(
        engine.database_url, engine.settings.schema, "retention", "restore", bundle, "--session", "s-1"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("restored 0 sessions (0 events)"), result.stdout
    with pytest.raises(ValidationError, match=r"none of \['s-3'\] is archived in"):
        engine.restore_sessions(bundle, ["s-3"])
    assert engine.retention.archived_in("s-2") == bundle  # still archived


def test_a_bundle_holding_a_session_archived_again_since_names_that_session(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """s-1 and s-2 archived together, s-1 restored alone and archived again (a second bundle):
    restoring the first bundle whole was refused with 'stream 2b6e…: FIRST is not the file it was
    archived to (SECOND …): not restored', a stream id the operator cannot map to a session. It
    now names the session and where to restore it from; --session s-2 restores the other."""
    _session(engine, "s-1", steps=1)
    _session(engine, "s-2", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [first] = engine.archive_sessions(tmp_path).workflows[0].bundles
    engine.restore_sessions(first, ["s-1"])
    [second] = engine.archive_sessions(tmp_path).workflows[0].bundles
    with pytest.raises(AuditError) as refused:
        engine.restore_sessions(first)
    assert str(refused.value).startswith(f"session 's-1' (stream {engine.session_uuid('s-1')}):")
    assert str(refused.value).endswith(
        f"nothing restored (restore that session from {Path(second).name},"
        " and this file's others with --session)"
    )
    assert engine.restore_sessions(first, ["s-2"]).sessions == ("s-2",)
    assert engine.restore_sessions(second).sessions == ("s-1",)


def test_the_same_fork_sent_again_after_its_parent_was_archived_is_answered_with_the_fork(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """The same fork sent again (its answer lost) is answered with the fork, 200, nothing appended
    (docs/erasure.md). Once the parent was archived, the retry of a fork at its version 4 was
    refused as archived (SessionArchived: 404, exit 3): it read the parent at that version first.
    The fork holds its parent and version: the retry is answered from it."""
    _session(engine, "s-old", steps=7, close=None)
    made = engine.fork_or_get_session("s-old", 4, "s-fork")
    engine.complete_session("s-old")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    assert engine.archive_sessions(tmp_path).workflows[0].sessions == ["s-old"]  # the fork is open
    again = engine.fork_or_get_session("s-old", 4, "s-fork")
    assert (again.created, again.state.version, again.state.context) == (False, 2, made.state.context)
    with TestClient(create_app(engine)) as client:
        answer = client.post("/v1/sessions/s-old/fork", json={"at_version": 4, "new_session_id": "s-fork"})
    assert answer.status_code == 200, answer.text
    # Another fork at an archived version still needs the parent's events
    with pytest.raises(SessionArchived):
        engine.fork_session("s-old", 4, "s-fork-2")
    with pytest.raises(SessionArchived):
        engine.fork_session("s-old", 5, "s-fork")  # another version under the same id


def test_a_restore_asking_for_a_session_the_bundle_does_not_hold_restores_nothing(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """retention restore BUNDLE --session s-1 --session s-9 (s-9 mistyped, or in another bundle)
    restored s-1 and said "restored 1 sessions", exit 0: s-9 was passed over unsaid. It is now
    refused naming it, nothing restored (exit 2)."""
    _session(engine, "s-1", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
    with pytest.raises(ValidationError, match=r"holds no session 's-9': nothing restored"):
        engine.restore_sessions(bundle, ["s-1", "s-9"])
    assert engine.retention.archived_in("s-1") == bundle
    result = run_cli(
        engine.database_url,
        engine.settings.schema,
        "retention",
        "restore",
        bundle,
        "--session",
        "s-1",
        "--session",
        "s-9",
    )
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().endswith("holds no session 's-9': nothing restored"), result.stderr
    assert engine.restore_sessions(bundle, ["s-1"]).sessions == ("s-1",)


def _snapshot_sql(engine: Engine, statement: str, session_id: str) -> int:
    """Run ``statement`` (``{}``: the snapshot table, ``%s``: the session's stream) as an intruder would."""
    with psycopg.connect(engine.database_url) as conn:
        table = SQL("{}.flowledger_snapshots").format(Identifier(engine.settings.schema))
        return conn.execute(SQL(statement).format(table), [engine.session_uuid(session_id)]).rowcount


@pytest.mark.parametrize("seal_personal_data", [False, True])
def test_an_archived_sessions_snapshot_edited_in_sql_is_named_and_a_restore_puts_the_sealed_one_back(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path, seal_personal_data: bool
) -> None:
    # Given an archived session (its events gone: its state is read from its snapshot alone),
    # whose last version the engine had snapshotted already (6, every 3 here)
    settings = make_settings(
        database_url=database_url,
        schema=pg_schema,
        snapshot_interval=3,
        seal_personal_data=seal_personal_data,
    )
    with Engine(settings=settings, clock=clock) as engine:
        _session(engine, "s-1", steps=4)
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        [bundle] = engine.archive_sessions(tmp_path).workflows[0].bundles
        before = engine.get_session("s-1")
        assert verify_chain(engine.audit).ok
        # When its total cost (0.0054) is edited in the snapshot's row, in place
        edited = _snapshot_sql(
            engine,
            "UPDATE {} SET state = overlay(state placing convert_to('\"_data_\":\"99.0054\"', 'UTF8')"
            " from position(convert_to('\"_data_\":\"0.0054\"', 'UTF8') in state) for 17)"
            " WHERE originator_id = %s AND originator_version = 6"
            " AND position(convert_to('\"_data_\":\"0.0054\"', 'UTF8') in state) > 0",
            "s-1",
        )
        assert edited == 1
    with Engine(settings=settings, clock=clock) as engine:
        # Then the session is not read from it (it answered the edited cost, 99.0054, before
        # snapshots were sealed): its seal no longer checks, and it has no events to fold from
        with pytest.raises(StoredEventUnreadable, match=r"version 6 .*its seal does not match"):
            engine.get_session("s-1")
        # And audit verify names it (it had said ok), and so does --session
        for report in (
            verify_chain(engine.audit),
            verify_chain(engine.audit, stream=engine.session_uuid("s-1")),
        ):
            assert [(f.kind, f.name, f.version) for f in report.findings] == [("altered", "s-1", 6)]
            assert "altered snapshot" in report.findings[0].detail
        # And a restore puts the sealed snapshot back: the session reads as it was archived
        engine.restore_sessions(bundle)
    with Engine(settings=settings, clock=clock) as engine:
        assert engine.get_session("s-1") == before
        assert verify_chain(engine.audit).ok


def test_a_session_archived_before_snapshots_were_sealed_reads_from_its_bases_snapshot(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session whose base and snapshot hold its snapshot unsealed, the base
    # sealed with the chain key (as retention archived it before snapshots carried seals)
    _session(engine, "old")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    engine.archive_sessions(tmp_path)
    before = engine.get_session("old")
    stream, key = engine.session_uuid("old"), engine.audit.chain_key
    tables = RetentionTables(engine.settings.schema)
    with psycopg.connect(engine.database_url) as conn:
        base = tables.bases(conn, key, [stream])[stream].base
        unsealed = stripped(
            StoredEvent(stream, base.through_version, base.snapshot_topic, base.snapshot_state)
        )
        old = replace(base, snapshot_state=unsealed.state)
        conn.execute(
            SQL(
                "UPDATE {}.flowledger_retention_bases SET snapshot_state = %s, seal = %s WHERE stream_id = %s"
            ).format(Identifier(engine.settings.schema)),
            [old.snapshot_state, old.seal(key), stream],
        )
    assert _snapshot_sql(
        engine,
        "UPDATE {} SET state = substring(state for length(state) - 61) WHERE originator_id = %s",
        "old",
    )
    # When a fresh engine reads it, then it reads as it was archived, and the log verifies
    with Engine(settings=engine.settings, clock=clock) as fresh:
        assert fresh.get_session("old") == before
        assert verify_chain(fresh.audit).ok
    # But the same unsealed snapshot edited is not read (its base no longer holds it)
    assert _snapshot_sql(
        engine,
        "UPDATE {} SET state = overlay(state placing convert_to('u', 'UTF8') from 2 for 1)"
        " WHERE originator_id = %s",
        "old",
    )
    with Engine(settings=engine.settings, clock=clock) as fresh, pytest.raises(StoredEventUnreadable):
        fresh.get_session("old")


def test_an_archived_sessions_snapshot_deleted_or_written_past_its_head_is_named(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given two archived sessions of 7 events (snapshots at 3 and 6, and the archive's at 7)
    _session(engine, "gone")
    _session(engine, "added")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    engine.archive_sessions(tmp_path)
    # When one's snapshot at its head is deleted (it then reads as at version 6), and the
    # other gains a snapshot at version 8, copied from its own, past every event
    assert _snapshot_sql(engine, "DELETE FROM {} WHERE originator_id = %s AND originator_version = 7", "gone")
    assert _snapshot_sql(
        engine,
        "INSERT INTO {0} SELECT originator_id, 8, topic, state FROM {0}"
        " WHERE originator_id = %s AND originator_version = 7",
        "added",
    )
    # Then audit verify names both
    found = sorted(
        (f.kind, f.name, f.version, f.detail.split(":")[0]) for f in verify_chain(engine.audit).findings
    )
    assert found == [("altered", "added", 8, "altered snapshot"), ("deleted", "gone", 7, "dropped snapshot")]


def test_a_bundle_is_restored_only_by_its_own_tenant(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path
) -> None:
    # Given a session of tenant acme, archived
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=3)
    with Engine(settings=settings, clock=clock, tenant="acme") as acme:
        _session(acme, "s-1")
        clock.now = START + timedelta(days=10)
        acme.retention.set_policy(WORKFLOW, 7)
        [bundle] = acme.archive_sessions(tmp_path).workflows[0].bundles
    # When globex restores acme's bundle, Then it is refused naming the tenant, and nothing is put back
    with (
        Engine(settings=settings, clock=clock, tenant="globex") as globex,
        pytest.raises(ValidationError, match="of tenant 'acme', not 'globex'"),
    ):
        globex.restore_sessions(bundle)
    with Engine(settings=settings, clock=clock, tenant="acme") as acme:
        assert _rows(acme, "s-1") == []
        # And acme restores it
        assert acme.restore_sessions(bundle).sessions == ("s-1",)


def test_a_bases_tenant_or_session_id_edited_in_sql_is_forged(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session whose base's session id is then edited (the seal covers its
    # stream id, which is the session id's uuid under its tenant)
    bundle = _archived_bundle(engine, clock, tmp_path)
    for column, value in (("session_id", "s-2"), ("tenant", "globex")):
        with psycopg.connect(engine.database_url) as conn:
            table = SQL("{}.flowledger_retention_bases").format(Identifier(engine.settings.schema))
            conn.execute(SQL("UPDATE {} SET {} = %s").format(table, Identifier(column)), [value])
        # Then audit verify names the base forged, and a restore refuses it
        findings = verify_chain(engine.audit).findings
        assert [f.kind for f in findings] == ["forged", "deleted"], column
        with pytest.raises(AuditError, match="not sealed"):
            engine.restore_sessions(bundle)
        with psycopg.connect(engine.database_url) as conn:
            conn.execute(SQL("UPDATE {} SET session_id = 's-1', tenant = 'default'").format(table))
        assert verify_chain(engine.audit).ok


def test_a_bundle_restored_into_a_store_that_never_held_it_is_refused(
    engine: Engine, clock: SetClock, tmp_path: Path, database_url: str, pg_schema: str
) -> None:
    # Given an archived session's bundle
    bundle = _archived_bundle(engine, clock, tmp_path)
    # When it is restored into another schema (which has the retention tables, and no base of it)
    other = make_settings(database_url=database_url, schema=f"{pg_schema}_other")
    try:
        with Engine(settings=other) as elsewhere:
            elsewhere.retention.set_policy(WORKFLOW, 7)
            # Then it is refused: its sessions were neither archived nor stored there
            with pytest.raises(ValidationError, match="neither archived nor stored"):
                elsewhere.restore_sessions(bundle)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(Identifier(f"{pg_schema}_other")))
            conn.execute(
                SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(Identifier(f"{pg_schema}_other_read"))
            )
    # And restored where it was archived, then again, the second time says it was restored already
    assert engine.restore_sessions(bundle).sessions == ("s-1",)
    again = engine.restore_sessions(bundle)
    assert again.sessions == ()
    assert list(again.skipped.values()) == ["restored already: its events are stored up to the bundle's head"]


def test_two_restores_of_one_bundle_at_once_restore_it_once(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an archived session, and a first restore held after it checked the bases and
    # before it drops them, while a second restore of the same bundle starts
    bundle = _archived_bundle(engine, clock, tmp_path)
    second_started = threading.Event()
    drop = RetentionTables.delete_bases

    def held(self: RetentionTables, conn: Any, streams: Any) -> int:
        if threading.current_thread().name == "first":
            second_started.wait(10)
            time.sleep(0.5)  # the second restore reads the bases meanwhile
        return drop(self, conn, streams)

    monkeypatch.setattr(RetentionTables, "delete_bases", held)
    outcomes: dict[str, Any] = {}

    def restore(name: str) -> None:
        with Engine(settings=engine.settings, clock=clock) as own:
            if name == "second":
                second_started.set()
            try:
                outcomes[name] = own.restore_sessions(bundle)
            except Exception as error:
                outcomes[name] = error

    threads = [threading.Thread(target=restore, args=(n,), name=n) for n in ("first", "second")]
    threads[0].start()
    time.sleep(0.2)
    threads[1].start()
    for thread in threads:
        thread.join(30)
    # Then one restores it and the other finds it restored already (it had been a bare
    # UniqueViolation from the events' primary key)
    assert isinstance(outcomes["first"], RestoreReport), outcomes
    assert isinstance(outcomes["second"], RestoreReport), outcomes
    assert sorted(len(r.sessions) for r in (outcomes["first"], outcomes["second"])) == [0, 1]
    assert verify_chain(engine.audit).ok


def test_the_whole_log_is_exported_after_a_retention_run_leaving_out_the_archived_streams(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given an archived session beside one that is still open
    _archived_bundle(engine, clock, tmp_path / "archive")
    _session(engine, "open", steps=2, close=None)
    # When the whole log is exported (it had refused: "stream … does not end at the head
    # checkpoint 1 signed (version 7); run `flowledger audit verify`", which said ok)
    result = run_cli(
        engine.database_url, engine.settings.schema, "audit", "export", "--out", str(tmp_path / "all.jsonl")
    )
    # Then the bundle holds the open session's stream and verifies; the archived one is left out, and said so
    assert result.returncode == 0, result.stderr
    assert "1 archived stream left out" in result.stderr
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    checked = verify_bundle(lines, engine.audit.signing.public_bytes)
    assert checked.ok, checked.problems
    assert checked.streams == 1
    assert {json.loads(line).get("stream") for line in lines} - {None} == {str(engine.session_uuid("open"))}


def test_an_export_that_fails_leaves_no_file_behind(engine: Engine, tmp_path: Path) -> None:
    # Given a session whose last event was deleted after a checkpoint signed it
    _session(engine, "s-1", steps=2)
    engine.audit.checkpoint()
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL(
                "DELETE FROM {}.flowledger_events WHERE originator_id = %s AND originator_version = 4"
            ).format(Identifier(engine.settings.schema)),
            [engine.session_uuid("s-1")],
        )
    # When it is exported, Then it is refused and no half-written bundle is left at --out
    out = tmp_path / "all.jsonl"
    result = run_cli(engine.database_url, engine.settings.schema, "audit", "export", "--out", str(out))
    assert result.returncode == 1, result.stderr
    assert "does not end at the head" in result.stderr
    assert not out.exists()


def test_a_later_run_never_writes_over_a_bundle_that_still_holds_archived_sessions(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A bundle's name is made of the tenant, workflow, the run's second and its first stream: a
    session of a bundle restored alone and archived again in that second (or under a frozen
    clock) made the same name, and the new bundle replaced the old one, whose other sessions
    were still archived in it: their events were gone. Each run's bundle gets a name of its own."""
    # Given two sessions archived into one bundle
    _session(engine, "s-1", steps=1)
    _session(engine, "s-2", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [first] = engine.archive_sessions(tmp_path).workflows[0].bundles
    kept = Path(first).read_bytes()
    # When the bundle's first session is restored alone and archived again at the same time
    head = min(("s-1", "s-2"), key=lambda s: str(engine.session_uuid(s)))
    other = "s-2" if head == "s-1" else "s-1"
    engine.restore_sessions(Path(first), [head])
    [second] = engine.archive_sessions(tmp_path).workflows[0].bundles
    # Then the first bundle is untouched, and both sessions restore from their own bundles
    assert second != first
    assert Path(first).read_bytes() == kept
    assert engine.restore_sessions(Path(first), [other]).sessions == (other,)
    assert engine.restore_sessions(Path(second)).sessions == (head,)
    assert [e.version for e in engine.history(other)] == [1, 2, 3]
    assert verify_chain(engine.audit).ok


def _bases_text(engine: Engine) -> str:
    """Every base row of the schema as text (its projection rows and all)."""
    with psycopg.connect(engine.database_url) as conn:
        rows = conn.execute(
            SQL("SELECT b::text FROM {}.flowledger_retention_bases b").format(
                Identifier(engine.settings.schema)
            )
        ).fetchall()
    return "\n".join(r[0] for r in rows)


def test_a_session_forgotten_while_its_batch_is_being_archived_is_left_out(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session written between the run's read of it and its transaction (here: its user
    forgotten while the bundle was written) had its rows up to the version read deleted and a
    base written with the projections' rows of before, the user's values in the clear, while
    ``forget`` reported it erased. The run now leaves out a session written meanwhile."""
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings, clock=clock) as engine:
        # Given a sealed session due for archiving, and another one
        projector = projector_for(engine)
        _session(engine, "s-1", steps=1)
        _session(engine, "s-2", steps=1)
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        rebuild(projector)
        write_bundle = RetentionService._write_bundle

        def forget_meanwhile(service: RetentionService, *args: Any) -> Any:
            written = write_bundle(service, *args)
            assert engine.forget("user-s-1").sessions == ("s-1",)
            return written

        monkeypatch.setattr(RetentionService, "_write_bundle", forget_meanwhile)
        # When the user of one is forgotten while the run writes their bundle
        report = archive(engine, projector, tmp_path)
        # Then that session is left out (its events stay), the other one is archived
        assert report.workflows[0].sessions == ["s-2"]
        assert "s-1" in report.workflows[0].skipped
        assert "user-s-1" not in _bases_text(engine)
        assert engine.get_session("s-1").erased
        assert [e.version for e in engine.history("s-1")] == [1, 2, 3, 4]
        assert verify_chain(engine.audit).ok


def test_a_session_archived_while_its_user_is_being_forgotten_is_not_taken_as_forgotten(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that archived a session after ``forget`` had checked it was not archived, and before
    its keys were destroyed, left the base's projection rows with the user's values in the clear
    while ``forget`` reported the user erased. ``forget`` now checks again before it destroys a
    key: it refuses, naming the bundle, keeps the keys, and completes after a restore."""
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings, clock=clock) as engine:
        # Given a sealed session due for archiving
        projector = projector_for(engine)
        _session(engine, "s-1", steps=1)
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        rebuild(projector)
        mark = ErasureService._mark
        bundles: list[str] = []

        def archive_meanwhile(stream: Any, reason: str, uow: Any) -> Any:
            if not bundles:
                bundles.extend(archive(engine, projector, tmp_path).workflows[0].bundles)
            return mark(stream, reason, uow)

        monkeypatch.setattr(ErasureService, "_mark", staticmethod(archive_meanwhile))
        # When the run archives it while its user is being forgotten
        with pytest.raises(ValidationError, match="retention restore"):
            engine.forget("user-s-1")
        # Then the key is kept (nothing is left unreadable that forget has not taken care of)
        [bundle] = bundles
        assert "user-s-1" in _bases_text(engine)
        # and once restored, forget completes it
        monkeypatch.setattr(ErasureService, "_mark", staticmethod(mark))
        engine.restore_sessions(Path(bundle))
        report = engine.forget("user-s-1")
        assert report.keys_destroyed == 1
        assert engine.get_session("s-1").erased
        assert "user-s-1" not in _bases_text(engine)


def test_a_bundle_written_under_a_relative_directory_is_named_by_its_absolute_path(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retention run --out archive`` kept ``archive/…jsonl`` in the base: ``history``, a replay
    and ``forget`` then named a file relative to the directory the run happened to be in, which
    another process (or the same shell, elsewhere) could not find. The base keeps the absolute path."""
    # Given a run into a relative directory
    _session(engine, "s-1", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    monkeypatch.chdir(tmp_path)
    [bundle] = engine.archive_sessions("archive").workflows[0].bundles
    # Then the report and the base name the bundle by its absolute path
    assert Path(bundle).is_absolute()
    assert Path(bundle).parent == tmp_path / "archive"
    monkeypatch.chdir("/")
    with pytest.raises(SessionArchived, match=str(bundle)):
        engine.history("s-1")
    assert engine.restore_sessions(Path(bundle)).sessions == ("s-1",)


def test_sessions_restored_after_a_rebuild_are_not_counted_twice(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A rebuild after archiving starts from the bases' rows; when the archived events were the
    last of the log, its position stayed before them, and once restored they were read again:
    the live tables counted the session twice (``projections verify`` listed the differences,
    the cost rows set aside as UniqueViolation dead letters). A restore moves a build past
    positions that hold no stored event (it has read everything there is up to them)."""
    # Given an archived session, the last of the log, and a rebuild after it
    projector = projector_for(engine)
    _session(engine, "s-0", steps=1)
    _session(engine, "s-1", steps=2)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    rebuild(projector)
    dashboard = _dashboard(engine)
    [bundle] = archive(engine, projector, tmp_path).workflows[0].bundles
    rebuild(projector)
    # When it is restored
    assert sorted(restore(engine, projector, bundle).sessions) == ["s-0", "s-1"]
    # Then the live tables, caught up, count each call once
    assert verify(projector) == []
    assert _dashboard(engine) == dashboard
    assert recent_dead_letters(projector) == []


def test_a_restore_while_a_rebuild_runs_is_not_counted_twice_by_it(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A rebuild folds the archived sessions' rows from their bases, then reads the log: a
    restore committed in between put the events back ahead of its reader, which applied them
    again. A build behind a stored event before them refuses the restore; one that has read
    all there is up to them is moved past them."""
    # Given an archived session between two open ones (never archived)
    projector = projector_for(engine)
    _session(engine, "s-0", steps=1, close=None)
    _session(engine, "s-1", steps=2)
    _session(engine, "s-2", steps=1, close=None)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    rebuild(projector)
    dashboard = _dashboard(engine)
    [bundle] = archive(engine, projector, tmp_path).workflows[0].bundles
    drive = projector.drive
    attempts: list[str] = []

    def restore_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not attempts:  # the rebuild has folded the bases and read nothing yet
            attempts.append("restore")  # (the restore catches up the live builds: not again)
            with pytest.raises(AuditError, match="would count them again: nothing restored"):
                restore(engine, projector, bundle)
            attempts.append("refused")
        return drive(*args, **kwargs)

    # When a restore runs while a rebuild is under way, behind s-0's events
    projector.drive = restore_meanwhile  # type: ignore[method-assign]
    rebuild(projector)
    projector.drive = drive  # type: ignore[method-assign]
    # Then it was refused and nothing restored; once the rebuild is done, it restores
    assert attempts == ["restore", "refused"]
    with pytest.raises(SessionArchived):
        engine.history("s-1")
    assert restore(engine, projector, bundle).sessions == ("s-1",)
    assert verify(projector) == []
    assert _dashboard(engine) == dashboard


def test_a_run_while_a_rebuild_runs_archives_nothing_the_rebuild_has_not_read(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A rebuild made before a run folds no base of it, then reads the log: a run that deleted
    rows it had not read yet left the new build without those sessions (the dashboard lost
    their cost once it switched). A run now rolls back its batch while a build is behind the
    events it archives, leaving no bundle, and archives once the rebuild is done."""
    # Given a due session and the dashboard as it was
    projector = projector_for(engine)
    _session(engine, "s-1", steps=2)
    _session(engine, "s-2", steps=1, close=None)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    rebuild(projector)
    dashboard = _dashboard(engine)
    drive = projector.drive
    attempts: list[str] = []

    def archive_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not attempts:  # the rebuild's builds are made and have read nothing yet
            attempts.append("archive")  # (a run catches up the live builds: not again)
            with pytest.raises(AuditError, match="it would never read them: nothing archived"):
                archive(engine, projector, tmp_path / "out")
            attempts.append("refused")
        return drive(*args, **kwargs)

    # When a run starts while a rebuild is under way
    projector.drive = archive_meanwhile  # type: ignore[method-assign]
    rebuild(projector)
    projector.drive = drive  # type: ignore[method-assign]
    # Then it archived nothing and left no bundle; the rebuild holds every session
    assert attempts == ["archive", "refused"]
    assert [e.version for e in engine.history("s-1")] == [1, 2, 3, 4]
    assert list((tmp_path / "out").glob("*")) == []
    assert _dashboard(engine) == dashboard
    # ... and once it is done, the run archives, and a rebuild keeps the totals
    assert archive(engine, projector, tmp_path / "out").workflows[0].sessions == ["s-1"]
    rebuild(projector)
    assert _dashboard(engine) == dashboard
    assert verify(projector) == []


def test_a_build_left_by_a_rebuild_that_stopped_does_not_stop_a_run(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """A run refuses while a build being filled is behind what it archives; one left by a
    rebuild whose process stopped (killed), which nobody fills, does not stop every run."""
    # Given a build at position 0 that no rebuild holds (its process was killed)
    projector = projector_for(engine)
    _session(engine, "s-1", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    rebuild(projector)
    dashboard = _dashboard(engine)
    control = f"{engine.settings.schema}_projections"
    with psycopg.connect(engine.database_url) as conn:
        conn.execute(
            SQL(
                "INSERT INTO {}.builds (schema_name, projection, kind, position)"
                " VALUES ('left_v9', 'cost', 'build', 0)"
            ).format(Identifier(control))
        )
    # When a run starts, Then it archives, and a restore then puts the session back
    [bundle] = archive(engine, projector, tmp_path).workflows[0].bundles
    assert restore(engine, projector, bundle).sessions == ("s-1",)
    assert _dashboard(engine) == dashboard
    assert verify(projector) == []


def test_forget_names_a_users_archived_session_recorded_in_the_clear(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    """``forget USER`` names the user's sessions recorded without sealing (they stay in the
    clear; the CLI exits 2), found by their Started events in the log. An archived one's events
    are in its bundle: ``forget`` said "erased 0 sessions (none)" and exited 0 while the bundle
    and the base's projection rows kept the user id in the clear. Its base's snapshot is read too."""
    # Given a session recorded without sealing, archived, and one of another user
    _session(engine, "s-1", steps=1)
    _session(engine, "s-2", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    assert engine.archive_sessions(tmp_path).sessions == 2
    # When its user is forgotten, Then it is named as left in the clear
    report = engine.forget("user-s-1")
    assert (report.sessions, report.in_the_clear) == ((), ("s-1",))
    assert engine.forget("user-s").in_the_clear == ()  # a prefix of a user id is no user


def test_a_bundle_that_cannot_be_written_whole_leaves_no_file_behind(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose bundle could not be written (a full disk) left its half-written ``.partial``
    file in the archive directory; now it leaves nothing, and archives nothing."""
    # Given a due session, and a disk that fills up during the export
    _session(engine, "s-1", steps=1)
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    export = retention_module.export_bundle

    def full_disk(trail: Any, out: Any, streams: Any) -> Any:
        out.write('{"type": "header"}\n')
        out.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retention_module, "export_bundle", full_disk)
    out = tmp_path / "out"
    out.mkdir()
    # When the run writes its bundle, Then it fails and leaves no file, and no row moved
    with pytest.raises(OSError, match="No space left"):
        engine.archive_sessions(out)
    assert list(out.iterdir()) == []
    assert [e.version for e in engine.history("s-1")] == [1, 2, 3]
    monkeypatch.setattr(retention_module, "export_bundle", export)
    assert engine.archive_sessions(out).sessions == 1


def test_a_bundle_archived_before_the_signing_key_was_rotated_restores_after_it(
    database_url: str, pg_schema: str, clock: SetClock, tmp_path: Path
) -> None:
    """A restore checked the bundle's checkpoint with the current public key only: after `audit
    rotate-signing-key` every bundle archived before it was refused ('does not verify: … the
    checkpoint's signature is not valid for this public key'), its sessions lost to the engine."""
    settings = make_settings(database_url=database_url, schema=pg_schema, audit_key_dir=tmp_path / "keys")
    with Engine(settings=settings, clock=clock) as engine:
        _session(engine, "s-1", steps=1)
        clock.now = START + timedelta(days=10)
        engine.retention.set_policy(WORKFLOW, 7)
        [bundle] = engine.archive_sessions(tmp_path / "archive").workflows[0].bundles
    rotate_signing_key(settings)
    with Engine(settings=settings, clock=clock) as engine:
        assert engine.restore_sessions(bundle).sessions == ("s-1",)
        assert engine.get_session("s-1").step_count == 1


def test_a_restore_names_the_session_of_each_stream_it_leaves_out(
    engine: Engine, clock: SetClock, tmp_path: Path
) -> None:
    # Given a bundle of two sessions
    _session(engine, "s-1")
    _session(engine, "s-2", close="abandon")
    clock.now = START + timedelta(days=10)
    engine.retention.set_policy(WORKFLOW, 7)
    [bundle] = archive(engine, projector_for(engine), tmp_path).workflows[0].bundles
    s1, s2 = (str(engine.session_uuid(s)) for s in ("s-1", "s-2"))

    # When one of them is restored, then both
    alone = engine.restore_sessions(bundle, ["s-1"])
    whole = engine.restore_sessions(bundle)

    # Then each stream left out is still keyed by its stream id, and named by its session id
    # beside it (a person reads session ids: "left out stream 13f06d71-...: not asked for")
    assert alone.skipped == {s2: "not asked for"}
    assert alone.skipped_sessions == {s2: "s-2"}
    assert whole.sessions == ("s-2",)
    assert list(whole.skipped) == [s1]
    assert whole.skipped_sessions == {s1: "s-1"}
