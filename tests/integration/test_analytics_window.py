"""The demo's analytics (``show_analytics``): its funnels cover the window its dashboard does."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from rich.console import Console

from flowledger.adapters.cli.projection_commands import show_analytics
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.support.clock import SetClock

pytestmark = pytest.mark.postgres

USED = LlmUsage(request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0)


def test_the_funnels_shown_beside_a_days_dashboard_count_that_days_sessions(
    clocked_engine: Engine, clock: SetClock
) -> None:
    # Given a session of workflow "flow" started three days ago and one started now
    clocked_engine.start_session("old", "flow")
    clocked_engine.record_step("old", "ask", usage=USED)
    clock.now += timedelta(days=3)
    clocked_engine.start_session("new", "flow")
    clocked_engine.record_step("new", "ask", usage=USED)
    # When the analytics of the last day are shown
    out = Console(record=True, width=200)
    show_analytics(clocked_engine, out)
    text = out.export_text()
    # Then the dashboard counts the day's one call and the funnel the day's one session (it
    # counted every session ever started, 2, beside a dashboard of the last day)
    assert "funnel flow: 1 sessions" in text
    assert "funnel flow: 2 sessions" not in text
