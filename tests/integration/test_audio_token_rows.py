"""Audio tokens in the read models: the cost dashboard (raw rows and roll-ups) and a session's
row sum them, a repricing prices them at the audio rates, and an archived session's rows
captured before the audio columns still fold into a rebuild (as no audio)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage
from flowledger.domain.pricing import ModelPrice
from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for, reprice
from flowledger.projections import retention as projection_retention
from flowledger.projections.rebuild import rebuild, verify
from flowledger.projections.retention import archive
from tests.integration.conftest import CLOCK_START
from tests.support.clock import SetClock
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
MODEL = "gpt-4o-audio-preview"
AUDIO_PRICE = ModelPrice(
    input_cost_per_token=Decimal("2.5e-6"),
    output_cost_per_token=Decimal("1e-5"),
    input_cost_per_audio_token=Decimal("4e-5"),
    output_cost_per_audio_token=Decimal("8e-5"),
)


def audio_usage(inp: int, out: int, audio_in: int, audio_out: int, cost: str = "0") -> LlmUsage:
    return LlmUsage(
        provider="openai",
        request_model=MODEL,
        response_model=MODEL,
        input_tokens=inp,
        output_tokens=out,
        audio_input_tokens=audio_in,
        audio_output_tokens=audio_out,
        cost_usd=Decimal(cost),
        latency_ms=200.0,
    )


def test_the_dashboard_and_a_sessions_row_sum_audio_tokens_and_a_reprice_prices_them(
    pg_engine: Engine,
) -> None:
    # Given a session with two audio calls and one text call
    script = SessionScript("voice", "support", T0)
    script.step("listen", T0 + timedelta(seconds=1), usage=audio_usage(1_200, 600, 1_000, 500))
    script.step("reply", T0 + timedelta(seconds=2), usage=audio_usage(300, 100, 250, 80))
    script.step("note", T0 + timedelta(seconds=3), usage=audio_usage(100, 10, 0, 0))
    append(pg_engine.log, interleave([script]))
    projector = projector_for(pg_engine)
    projector.catch_up()
    # When the dashboard is read (raw rows and roll-ups) and the calls repriced at audio rates
    with projector.connect() as conn:
        rows = [
            dashboard(
                conn, projector.names.reader, tenant="default", since=T0 - timedelta(days=1), by=[], read=r
            )
            for r in ("raw", "rollups")
        ]
        [repriced] = reprice(
            conn, projector.names.reader, {MODEL: AUDIO_PRICE}, since=T0, by=(), tenant="default"
        )
        session = conn.execute(
            SQL("SELECT input_tokens, audio_input_tokens, audio_output_tokens FROM {}.sessions").format(
                Identifier(projector.names.reader)
            )
        ).fetchall()
    # Then both reads sum the audio tokens
    for [row] in rows:
        assert (row.input_tokens, row.audio_input_tokens) == (1_600, 1_250)
        assert (row.output_tokens, row.audio_output_tokens) == (710, 580)
    # And the repricing prices them at the audio rates: 350 text in x $2.50/M + 1,250 audio in
    # x $40/M + 130 text out x $10/M + 580 audio out x $80/M
    assert repriced.repriced_cost_usd == Decimal("0.000875") + Decimal("0.05") + Decimal("0.0013") + Decimal(
        "0.0464"
    )
    # And the session's row sums them
    assert session == [(1_600, 1_250, 580)]


def _without_audio(captured: dict[Any, dict[str, Any]], version: int) -> dict[Any, dict[str, Any]]:
    """Captured rows as a release before the audio columns wrote them (its schema version)."""
    for entry in captured.values():
        entry["schema_version"] = version
        for rows in entry["tables"].values():
            for row in rows:
                row.pop("audio_input_tokens", None)
                row.pop("audio_output_tokens", None)
    return captured


def test_an_archived_sessions_rows_captured_before_audio_tokens_fold_into_a_rebuild(
    clocked_engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a closed session archived by a release whose cost rows (v5) and session rows
    # (current_state v4) had no audio columns
    engine = clocked_engine
    engine.start_session("old", "customer_service")
    engine.record_step(
        "old",
        "answer",
        input={},
        output={},
        usage=LlmUsage(
            provider="openai",
            request_model="gpt-4.1",
            input_tokens=100,
            output_tokens=20,
            cost_usd=Decimal("0.00036"),
        ),
    )
    engine.complete_session("old", {})
    projector = projector_for(engine)
    projector.catch_up()
    capture = projection_retention.capture
    old_versions = {"cost": 5, "current_state": 4}

    def captured_before_audio(cur: Any, projection: Any, schema: str) -> dict[Any, dict[str, Any]]:
        rows = capture(cur, projection, schema)
        if projection.name in old_versions:
            rows = _without_audio(rows, old_versions[projection.name])
        return rows

    monkeypatch.setattr(projection_retention, "capture", captured_before_audio)
    clock.now = CLOCK_START + timedelta(days=10)
    engine.retention.set_policy("customer_service", 7)
    assert archive(engine, projector, tmp_path).sessions == 1
    # When the projections are rebuilt (the archived rows fold into the new build)
    rebuild(projector)
    # Then the archived call and session are there, with no audio tokens
    with psycopg.connect(engine.database_url) as conn:
        reader = Identifier(f"{engine.settings.schema}_read")
        calls = conn.execute(
            SQL(
                "SELECT input_tokens, audio_input_tokens, audio_output_tokens, cost_usd FROM {}.llm_calls"
            ).format(reader)
        ).fetchall()
        sessions = conn.execute(
            SQL("SELECT input_tokens, audio_input_tokens, audio_output_tokens FROM {}.sessions").format(
                reader
            )
        ).fetchall()
    assert calls == [(100, 0, 0, Decimal("0.00036"))]
    assert sessions == [(100, 0, 0)]
    assert verify(projector) == []
