"""Which day a model call counts in: the budget's and the dashboard's are one and the same, the
moment its cost was recorded (its settlement, which stamps its event), whenever its hold was
taken. A call held at 23:59:59 UTC and answered after midnight counted in the budget's 30
November (its hold's window) and in the dashboard's 1 December (its event's stamp)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from flowledger.domain.errors import LlmCallFailed
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from tests.support.clock import SetClock
from tests.support.llm import ScriptedLlm
from tests.support.store_checks import caught_up_dashboard

pytestmark = pytest.mark.postgres

BEFORE_MIDNIGHT = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)
COST = Decimal("0.25")


@pytest.fixture
def settings(database_url: str, pg_schema: str) -> Settings:
    return Settings(home=Path("/nonexistent"), database_url=database_url, schema=pg_schema)


def budget_days(settings: Settings) -> dict[str, Decimal]:
    """Each day window of the ledger with what it spent."""
    windows = psycopg.sql.Identifier(settings.schema, "budget_windows")
    with psycopg.connect(settings.database_url or "") as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT (window_start AT TIME ZONE 'UTC')::date::text, spent_usd FROM {}").format(
                windows
            )
        ).fetchall()
    return {day: spent for day, spent in rows if spent}


def reserved(settings: Settings) -> Decimal:
    """What the ledger's windows still hold, summed."""
    windows = psycopg.sql.Identifier(settings.schema, "budget_windows")
    with psycopg.connect(settings.database_url or "") as conn:
        row = conn.execute(
            psycopg.sql.SQL("SELECT coalesce(sum(reserved_usd), 0) FROM {}").format(windows)
        ).fetchone()
    return row[0] if row else Decimal(0)


def dashboard_days(engine: Engine) -> dict[str, Decimal]:
    """Each day of the cost dashboard with what its calls cost."""
    rows = caught_up_dashboard(engine, since=BEFORE_MIDNIGHT - timedelta(days=2), by=["day"], read="raw")
    return {row.group[0].date().isoformat(): row.cost_usd for row in rows if row.cost_usd}


def usage() -> LlmUsage:
    return LlmUsage(provider="x", request_model="gpt-4.1", input_tokens=10, output_tokens=5, cost_usd=COST)


@pytest.mark.parametrize("fails", [False, True], ids=["answered", "failed"])
async def test_a_call_held_before_midnight_and_settled_after_counts_in_one_day_on_both(
    settings: Settings, fails: bool
) -> None:
    # Given a day budget on the tenant, a second before midnight (UTC)
    clock = SetClock(BEFORE_MIDNIGHT)
    engine = Engine(settings=settings, clock=clock)
    try:
        engine.start_session("late", "support")
        engine.budgets.set("tenant", None, "day", "10", mode="alert")

        def past_midnight() -> None:
            clock.now += timedelta(seconds=2)

        # When a call is held at 23:59:59 and answered (or fails, billed) at 00:00:01
        error = LlmCallFailed("timed out", error_type="timeout", attempts=1, usage=usage()) if fails else None
        engine.llm = ScriptedLlm(usage=usage(), meanwhile=past_midnight, error=error)
        if fails:
            with pytest.raises(LlmCallFailed):
                await engine.process_step("late", "greet", {"text": "hi"})
        else:
            await engine.process_step("late", "greet", {"text": "hi"})

        # Then the budget and the dashboard count it in the same day: the day it was settled
        assert dashboard_days(engine) == {"2026-12-01": COST}
        assert budget_days(settings) == {"2026-12-01": COST}
        # and the hold left the day it was taken in
        assert reserved(settings) == 0
    finally:
        engine.close()


async def test_a_task_classification_held_before_midnight_and_answered_after_counts_in_one_day_on_both(
    settings: Settings,
) -> None:
    # Given a day budget on the tenant (which task calls are charged to), a second before midnight
    clock = SetClock(BEFORE_MIDNIGHT)
    engine = Engine(settings=settings, clock=clock)
    try:
        engine.budgets.set("tenant", None, "day", "10", mode="alert")
        engine.create_task("late", "Fix the race in the Go worker", priority="medium")

        def past_midnight() -> None:
            clock.now += timedelta(seconds=2)

        # When its classification is held at 23:59:59 and answered at 00:00:01
        answer = '{"category": "bug_fix", "complexity": "medium", "estimated_hours": 3}'
        engine.llm = ScriptedLlm(answer, usage=usage(), meanwhile=past_midnight)
        await engine.classify_task("late")

        # Then the budget and the dashboard count it in the same day
        assert dashboard_days(engine) == {"2026-12-01": COST}
        assert budget_days(settings) == {"2026-12-01": COST}
        assert reserved(settings) == 0
    finally:
        engine.close()
