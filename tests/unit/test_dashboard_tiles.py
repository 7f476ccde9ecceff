"""The dashboard page's cost tiles and cost charts show the recorded cost exactly, never through a float."""

from __future__ import annotations

import re
from decimal import Decimal

from flowledger.adapters.http.dashboard import _cost_chart, _cost_split_chart, _summary
from flowledger.projections.cost_queries import DashboardRow


def row(cost: str, failed: str = "0") -> DashboardRow:
    return DashboardRow(
        group=("gemini-2.5-flash",),
        calls=4,
        errors=0,
        errors_by_type={},
        input_tokens=100,
        output_tokens=4,
        cached_tokens=0,
        reasoning_tokens=0,
        cost_usd=Decimal(cost),
        latency_avg_ms=10.0,
        latency_p50_ms=10.0,
        latency_p95_ms=10.0,
        latency_p99_ms=10.0,
        failed_cost_usd=Decimal(failed),
    )


def test_a_cheap_days_cost_reads_exactly_not_as_zero() -> None:
    # Given a day of calls that cost $0.00004, $0.0000125 of it on failed calls
    tiles = _summary([row("0.0000400", failed="0.0000125")], "24h")
    # Then the tiles say so (through a float at 4 places both read $0.0000)
    assert "<b>$0.00004</b>" in tiles
    assert "<b>$0.0000125</b>" in tiles
    # And amounts of a column's own decimals keep them, larger ones their separators
    assert "<b>$0.0041</b>" in _summary([row("0.0041")], "24h")
    assert "<b>$1,234.50</b>" in _summary([row("1234.5")], "24h")
    assert "<b>$1,234.123456</b>" in _summary([row("1234.123456")], "24h")


def test_the_cost_charts_write_each_models_cost_exactly_not_through_a_float() -> None:
    # Given a model that cost $0.00045 (the float nearest it lies below it) and one $0.00004
    rows = [row("0.00045", failed="0.00004"), row("10000000.50097")]
    # When the cost charts are drawn
    charts = _cost_chart(rows) + _cost_split_chart(rows)
    # Then each figure beside a bar and in its hover is the amount, to its last decimal: through
    # a float at 4 places they read $0.0004, $0.0000 and $10,000,000.50
    figures = re.findall(r'class="value">(\$[^<]*)</text>', charts)
    assert figures[:1] == ["$0.00045"]
    assert "$10,000,000.50097" in figures
    assert "$0.00004" in figures
    assert "failed calls: $0.00004</title>" in charts
    assert "$0.0004<" not in charts
