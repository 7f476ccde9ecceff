"""The CLI's cost cells are exact: at least a column's decimals, and every further one a cost has."""

from __future__ import annotations

from decimal import Decimal

from rich.console import Console

from flowledger.adapters.cli.projection_commands import dashboard_table
from flowledger.adapters.cli.rendering import money
from flowledger.projections.cost_queries import DashboardRow


def test_a_cost_below_the_columns_decimals_is_shown_whole_not_rounded_away() -> None:
    # (the dashboard printed $0.00004 as 0.0000 and $0.00028 as 0.0003)
    assert money(Decimal("0.00004"), 4) == "0.00004"
    assert money(Decimal("0.00028000"), 4) == "0.00028"
    assert money(Decimal("0.0084"), 4) == "0.0084"
    assert money(Decimal("0.01"), 4) == "0.0100"
    assert money(Decimal("0E-9"), 4) == "0.0000"
    assert money(Decimal("-0.00972"), 6, sign=True) == "-0.009720"
    assert money(Decimal("0.0000125"), 6, sign=True) == "+0.0000125"


def test_the_dashboard_shows_a_cheap_models_cost_exactly() -> None:
    # Given a day of gemini-2.5-flash calls that cost $0.00004 in all
    row = DashboardRow(
        group=("gemini-2.5-flash",),
        calls=4,
        errors=0,
        errors_by_type={},
        input_tokens=100,
        output_tokens=4,
        cached_tokens=0,
        reasoning_tokens=0,
        cost_usd=Decimal("0.0000400"),
        latency_avg_ms=10.0,
        latency_p50_ms=10.0,
        latency_p95_ms=10.0,
        latency_p99_ms=10.0,
    )
    # When the dashboard table is printed
    text = printed(row)
    # Then its cost reads $0.00004, not 0.0000 (free)
    assert "0.00004" in text
    assert "0.0000 " not in text


def printed(row: DashboardRow) -> str:
    """The dashboard table of ``row`` as the CLI prints it, as text."""
    console = Console(width=200, record=True)
    console.print(dashboard_table([row], ["model"], "model calls"))
    return console.export_text()


def tokens_row(input_tokens: int, output_tokens: int, cached_tokens: int) -> DashboardRow:
    """One gpt-4.1 call with these token counts (the table abbreviates them)."""
    return DashboardRow(
        group=("gpt-4.1",),
        calls=1,
        errors=0,
        errors_by_type={},
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached_tokens,
        reasoning_tokens=0,
        cost_usd=Decimal("1"),
        latency_avg_ms=None,
        latency_p50_ms=None,
        latency_p95_ms=None,
        latency_p99_ms=None,
    )


def test_token_counts_just_under_a_million_read_as_a_million_not_a_thousand_k() -> None:
    # Given a model's day of 999,999 input and 999,950 output tokens
    text = printed(tokens_row(999_999, 999_950, 999_949))
    # Then they read 1.0M (they read 1000.0k, which no other count of the column is written as)
    assert "1.0M/1.0M/999.9k" in text
    assert "1000.0k" not in text


def test_token_counts_of_a_billion_or_more_read_in_billions() -> None:
    # Given a busy model's month: 999,999,999 input and 12,345,678,901 output tokens
    text = printed(tokens_row(999_999_999, 12_345_678_901, 999_949_999))
    # Then they read 1.0B and 12.3B (they read 1000.0M and 12345.7M)
    assert "1.0B/12.3B/999.9M" in text
