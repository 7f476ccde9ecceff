"""A session's totals count every token type its calls reported, cache writes included, as the
cost dashboard does; sessions whose snapshots were taken before they did still read (and audit)
as their events fold. A step that wrote 1,000 tokens to the cache (200 for an hour) read
``cache_read_input_tokens`` and no word of the writes, in the state, over REST and in the CLI."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.schemas import SessionOut
from flowledger.adapters.llm import load_price_table
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from flowledger.projections import projector_for
from tests.conftest import make_settings
from tests.support.store_checks import caught_up_dashboard

pytestmark = pytest.mark.postgres

CLAUDE = load_price_table().price_for("claude-sonnet-4.5")
TOKENS = {"input_tokens": 1_500, "output_tokens": 80, "cache_read_input_tokens": 200}


def cache_writing(written: int = 1_000, hour: int = 200) -> LlmUsage:
    """A call that wrote ``written`` prompt tokens to the cache, ``hour`` of them for an hour."""
    counts = {**TOKENS, "cache_creation_input_tokens": written, "cache_creation_1h_input_tokens": hour}
    return LlmUsage(
        provider="anthropic", request_model="claude-sonnet-4.5", cost_usd=CLAUDE.cost(**counts), **counts
    )


def dashboard_cache_writes(engine: Engine) -> int:
    rows = caught_up_dashboard(engine, since=engine.clock() - timedelta(hours=1), by=[])
    return sum(row.cache_creation_tokens for row in rows)


def session_row_cache_writes(engine: Engine, session_id: str) -> tuple[int, int]:
    projector = projector_for(engine)
    projector.catch_up()
    with projector.connect_reader() as conn:
        row = conn.execute(
            SQL(
                "SELECT cache_creation_input_tokens, cache_creation_1h_input_tokens FROM {}.sessions"
                " WHERE session_id = %s"
            ).format(Identifier(projector.names.reader)),
            [session_id],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_sessions_totals_count_its_calls_cache_writes_as_the_dashboard_does(pg_engine: Engine) -> None:
    engine = pg_engine
    # Given a session whose two calls wrote 1,000 and 500 tokens to the cache (200 and 0 for an hour)
    engine.start_session("cw", "support")
    engine.record_step("cw", "greet", usage=cache_writing())
    engine.record_step("cw", "answer", usage=cache_writing(500, 0))
    # When its state is read, and answered over REST
    totals = engine.get_session("cw").totals
    answered = SessionOut.of(engine.get_session("cw")).totals
    # Then the cache writes are counted, as on the cost dashboard
    assert (totals.cache_creation_input_tokens, totals.cache_creation_1h_input_tokens) == (1_500, 200)
    assert (answered.cache_creation_input_tokens, answered.cache_creation_1h_input_tokens) == (1_500, 200)
    assert dashboard_cache_writes(engine) == totals.cache_creation_input_tokens
    # And so does its row of the sessions read model (the current_state projection)
    assert session_row_cache_writes(engine, "cw") == (1_500, 200)
    assert totals.cost_usd == cache_writing().cost_usd + cache_writing(500, 0).cost_usd > Decimal(0)


def snapshots_as_version_6(database_url: str, schema: str) -> int:
    """Rewrite the schema's snapshots as state version 6 stored them: totals without cache writes."""
    as_version_6 = (
        "UPDATE {snapshots} SET state = convert_to(jsonb_set("
        "convert_from(state, 'UTF8')::jsonb #- '{{state,totals,_data_,cache_creation_input_tokens}}'"
        " #- '{{state,totals,_data_,cache_creation_1h_input_tokens}}',"
        " '{{state,class_version}}', '6')::text, 'UTF8')"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        changed = conn.execute(SQL(as_version_6).format(snapshots=Identifier(schema, "flowledger_snapshots")))
        return changed.rowcount


def test_a_session_snapshotted_before_cache_writes_were_totalled_reads_and_audits_as_its_events_fold(
    database_url: str, pg_schema: str
) -> None:
    # Given a session of cache-writing steps whose snapshots were taken by state version 6
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=2, audit_chain=False
    )
    with Engine(settings=settings) as engine:
        engine.start_session("old", "support")
        for step in ("a", "b", "c"):
            engine.record_step("old", step, usage=cache_writing())
    assert snapshots_as_version_6(database_url, pg_schema) >= 1
    with Engine(settings=settings) as engine:
        # When it is read, and a step is added
        before = engine.get_session("old").totals
        engine.record_step("old", "d", usage=cache_writing())
        after = engine.get_session("old").totals
        # Then every call's cache writes count, those before the snapshot too
        assert before.cache_creation_input_tokens == 3_000
        assert after.cache_creation_input_tokens == 4_000
        assert after.calls == 4
        # And its snapshots audit clean: the old ones' lack is the upgrade's, no finding
        assert verify_snapshots(engine.log, [engine.session_uuid("old")]) == []
