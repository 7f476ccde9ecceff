"""A session's window of recent steps is bounded by bytes as well as by count (issue 11, item 3):
stored snapshots stay under 64 KiB with realistic step payloads, replay equals the fold, and a
key whose step left the window (or never entered it) is still found in the stream."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import psycopg
import pytest
from eventsourcing.application import project_aggregate
from psycopg import sql

from flowledger.domain.session import RECENT_STEPS, WINDOW_BYTES
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm
from tests.support.snapshot_rows import sealed_again, snapshot_json

SNAPSHOT_LIMIT = 64 * 1024


@pytest.fixture
def snapshotting_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """An engine on PostgreSQL with the default snapshot interval (every 50 events)."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        yield engine


SESSION_SNAPSHOT = "eventsourcing.domain:Snapshot"
"""The topic a session's snapshots are stored under (the library's class, with its state)."""


def latest_snapshot(database_url: str, schema: str, engine: Engine, session_id: str) -> tuple[int, bytes]:
    """The version and stored bytes of a session's latest snapshot, as bench_long_sessions reads them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT originator_version, state FROM {}.flowledger_snapshots WHERE originator_id = %s "
                "ORDER BY originator_version DESC LIMIT 1"
            ).format(sql.Identifier(schema)),
            (engine.session_uuid(session_id),),
        ).fetchone()
    assert row is not None
    return int(row[0]), bytes(row[1])


def record_four_kb_steps(engine: Engine, session_id: str, steps: int) -> None:
    for n in range(steps):
        engine.record_step(
            session_id,
            "answer",
            input={"prompt": f"{n} " + "p" * 2_500},
            output={"reply": f"{n} " + "r" * 1_500},
            idempotency_key=f"turn-{n}",
        )


def test_a_long_session_of_four_kb_steps_stores_snapshots_under_64_kib(
    snapshotting_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given 2,000 steps of about 4 KB of input and output each, no usage (count-only: 109 KB)
    engine = snapshotting_engine
    engine.start_session("long", "cs")
    record_four_kb_steps(engine, "long", 2_000)
    # Then the latest stored snapshot is under 64 KiB
    version, stored = latest_snapshot(database_url, pg_schema, engine, "long")
    assert version == 2_000
    assert len(stored) < SNAPSHOT_LIMIT
    # And the state keeps the most recent steps within the byte budget
    state = engine.get_session("long")
    assert [r.idempotency_key for r in state.history] == [f"turn-{n}" for n in range(1_994, 2_000)]
    assert sum(r.window_bytes for r in state.history) <= WINDOW_BYTES
    assert state.step_count == 2_000
    # And a fresh engine, loading from that snapshot, reads what a fold from the first event does
    aggregate_id = engine.session_uuid("long")
    with Engine(settings=engine.settings) as fresh:
        from_snapshot = fresh.get_session("long")
        folded = project_aggregate(None, fresh.log.stream(aggregate_id))
    assert folded is not None
    assert from_snapshot == folded.state() == state
    # And a step that left the window is still found by its key, and nothing is appended
    again = engine.record_step(
        "long",
        "answer",
        input={"prompt": "10 " + "p" * 2_500},
        output={"reply": "10 " + "r" * 1_500},
        idempotency_key="turn-10",
    )
    assert again.version == 12
    assert engine.get_session("long").version == 2_001


def test_a_small_step_session_still_keeps_twenty_steps(
    snapshotting_engine: Engine, database_url: str, pg_schema: str
) -> None:
    engine = snapshotting_engine
    engine.start_session("small", "cs")
    for n in range(199):
        engine.record_step(
            "small", "answer", input={"q": f"q{n}"}, output={"a": f"a{n}"}, idempotency_key=f"k{n}"
        )
    state = engine.get_session("small")
    assert len(state.history) == RECENT_STEPS
    assert state.history[-1].idempotency_key == "k198"
    _, stored = latest_snapshot(database_url, pg_schema, engine, "small")
    assert len(stored) < SNAPSHOT_LIMIT
    assert b"window_bytes" in stored


def test_a_retry_of_a_step_too_large_for_the_window_returns_it_and_appends_nothing(engine: Engine) -> None:
    # Given a keyed step larger than the whole window budget, after a few small ones
    engine.start_session("big", "cs")
    for n in range(3):
        engine.record_step("big", "answer", input={"q": n}, output={"a": n}, idempotency_key=f"k{n}")
    document = {"doc": "d" * (WINDOW_BYTES + 1_000)}
    first = engine.record_step(
        "big", "summarise", input=document, output={"ok": True}, idempotency_key="huge"
    )
    state = engine.get_session("big")
    assert state.history == ()  # not kept: the window may be empty
    assert (first.step, first.version, first.input) == ("summarise", 5, document)
    # When it is retried under its key
    again = engine.record_step(
        "big", "summarise", input=document, output={"ok": True}, idempotency_key="huge"
    )
    # Then the same step is returned and nothing is appended
    assert again == first
    assert engine.get_session("big").version == state.version == 5
    assert len(engine.history("big")) == 5
    # And the full history still holds every step
    assert [r.idempotency_key for r in engine.session_steps("big")] == ["k0", "k1", "k2", "huge"]


def test_an_old_snapshot_whose_window_passes_the_budget_loads_as_the_fold(
    snapshotting_engine: Engine, database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a stored snapshot as version 3 took it: 20 steps of about 4 KB, no window_bytes (sealed
    # with the chain key, as the engine stores every snapshot)
    engine = snapshotting_engine
    engine.start_session("old", "cs")
    record_four_kb_steps(engine, "old", 49)  # the snapshot at version 50
    aggregate_id = engine.session_uuid("old")
    steps = engine.session_steps("old")
    version, stored = latest_snapshot(database_url, pg_schema, engine, "old")
    assert version == 50
    body = snapshot_json(stored)
    mapper = engine.log.mapper.transcoder
    window = steps[-RECENT_STEPS:]
    old = json.loads(mapper.encode({"history": window}))["history"]
    for record in old:
        del record["_data_"]["window_bytes"]
    body["state"].update(
        class_version=3,
        history=old,
        recent_keys={r.idempotency_key: r.version for r in window if r.idempotency_key},
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.flowledger_snapshots SET state = %s"
                " WHERE originator_id = %s AND originator_version = 50"
            ).format(sql.Identifier(pg_schema)),
            (sealed_again(engine, aggregate_id, 50, SESSION_SNAPSHOT, body), aggregate_id),
        )
    # When a fresh engine loads the session from it (from it: not passed over as unreadable)
    with caplog.at_level(logging.WARNING), Engine(settings=engine.settings) as fresh:
        loaded = fresh.get_session("old")
        assert "does not read back" not in caplog.text
        folded = project_aggregate(None, fresh.log.stream(aggregate_id))
        # Then it reads as the fold of every event does, and takes steps on from there
        assert folded is not None
        assert loaded == folded.state()
        assert len(loaded.history) == 6
        record_four_kb_steps(fresh, "old", 1)  # turn-0 again: found in the stream
        assert fresh.get_session("old").version == 50


async def test_concurrent_calls_under_one_key_for_a_step_too_large_for_the_window_share_one_call(
    engine: Engine,
) -> None:
    # Given a model step whose input alone passes the window's budget, asked 10 times at once
    engine.llm = llm = ScriptedLlm(delay=0.05)
    engine.start_session("big", "cs")
    document = {"doc": "d" * (WINDOW_BYTES + 1_000)}
    records = await asyncio.gather(
        *(engine.process_step("big", "summarise", document, idempotency_key="huge") for _ in range(10))
    )
    # Then the waiters, finding no record in the window, get the stored step: one model call
    assert len(llm.calls) == 1
    assert all(r == records[0] for r in records)
    assert engine.get_session("big").history == ()
    again = await engine.process_step("big", "summarise", document, idempotency_key="huge")
    assert again == records[0]
    assert len(llm.calls) == 1
    assert [e.event_type.rsplit(".", 1)[-1] for e in engine.history("big")] == [
        "Started",
        "StepStarted",
        "StepProcessed",
    ]


def test_after_forget_the_erasing_engine_shows_the_window_a_fresh_replay_shows(
    database_url: str, pg_schema: str, quick_purge: None
) -> None:
    # Given a sealed session of 4 KB steps: its window keeps a few of them, measured in the clear
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings) as engine:
        engine.start_session("forgotten", "support", user_id="erin")
        record_four_kb_steps(engine, "forgotten", 12)
        assert len(engine.get_session("forgotten").history) < 12
        # When its data is erased
        engine.forget_session("forgotten")
        # Then the erasing engine's state is the fold of the log as it now reads (markers, which
        # measure small: all 12 fit), as a fresh engine's, not its earlier window turned to markers
        seen_here = engine.get_session("forgotten")
        with Engine(settings=settings) as fresh:
            replayed = fresh.get_session("forgotten")
        assert [r.version for r in seen_here.history] == [r.version for r in replayed.history]
        assert len(replayed.history) == 12
        # And the copy its next command would decide on (a pending step's answer may still be
        # recorded, and snapshotted) is no earlier window either: none is cached, the log is read
        cached = engine.store.cached(engine.session_uuid("forgotten"))
        assert cached is None or [r.version for r in cached.history] == [r.version for r in replayed.history]
