"""``budgets list`` shows amounts as plain decimals, whatever scale the ledger returns them at."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from flowledger.adapters.cli.budget_commands import budget_row
from flowledger.adapters.http.budget_panel import budget_panel
from flowledger.domain.budget import BudgetSpec
from flowledger.infrastructure.postgres.budgets import Burn


def test_a_released_reservation_reads_as_zero_not_in_exponent_notation() -> None:
    # Given a burn as the ledger returns it after a reservation was released (numeric(…, 9))
    spec = BudgetSpec.of(scope="model", subject="gpt-4o", period="day", limit_usd="25")
    burn = Burn(
        budget_id=uuid.uuid4(),
        spec=spec,
        window_start=datetime(2026, 12, 2, tzinfo=UTC),
        spent_usd=Decimal("0.001234500"),
        reserved_usd=Decimal("0E-9"),
    )
    # When it is rendered for the table
    row = budget_row(burn)
    # Then every amount is a plain decimal, as the REST API shows it
    assert row == [
        "model",
        "gpt-4o",
        "day",
        "enforce",
        "2026-12-02",
        "0.001234500",
        "0.000000000",
        "25",
        "0.00",
    ]


def test_a_budgets_percentage_is_read_whatever_decimal_context_the_caller_set() -> None:
    """An alert budget spent at 15,050 % of its limit: ``Burn.percent`` raised InvalidOperation
    in an embedding service's ``getcontext().prec = 6`` (the quantized 15050.00 needs 7 digits),
    so its ``engine.budgets.burn()`` rows could not be read for their percentage."""
    from decimal import localcontext

    spec = BudgetSpec(scope="tenant", subject="t", period="day", limit_usd=Decimal("1"), mode="alert")
    burn = Burn(
        budget_id=uuid.uuid4(),
        spec=spec,
        window_start=datetime(2026, 12, 6, tzinfo=UTC),
        spent_usd=Decimal("150.5"),
        reserved_usd=Decimal(0),
    )
    with localcontext() as embedder:
        embedder.prec = 6
        percent = burn.percent
    assert percent == Decimal("15050.00")


@pytest.mark.parametrize(
    ("spent", "limit"),
    [("NaN", "5"), ("Infinity", "5"), ("1", "NaN"), ("Infinity", "Infinity")],
)
def test_a_ledger_amount_that_is_no_number_is_shown_as_such_on_the_page_and_in_the_list(
    spent: str, limit: str
) -> None:
    # Given a budget whose ledger row was edited in the database to an amount that is no number
    spec = BudgetSpec(scope="workflow", subject="w", period="day", limit_usd=Decimal(limit), mode="enforce")
    burn = Burn(
        budget_id=uuid.uuid4(),
        spec=spec,
        window_start=datetime(2026, 12, 6, tzinfo=UTC),
        spent_usd=Decimal(spent),
        reserved_usd=Decimal(0),
    )
    # When the dashboard page's panel and the CLI's row are drawn, Then its burn reads NaN: the
    # page's GET /dashboard was a 500 for the whole tenant (decimal.InvalidOperation comparing it)
    assert burn.percent.is_nan()
    assert "NaN%" in budget_panel([burn])
    assert budget_row(burn)[-1] == "NaN"


@pytest.mark.parametrize(
    ("spent", "shown"),
    [
        ("9.9995", "99.99"),
        ("4.9999", "49.99"),
        ("7.99999", "79.99"),
        ("10", "100.00"),
        ("10.00999", "100.09"),
    ],
)
def test_a_budgets_percentage_never_shows_a_threshold_reached_before_its_alert_fires(
    spent: str, shown: str
) -> None:
    """Rounded half-even, $9.9995 of a $10 limit (99.995 %) showed "100.00 %" while the 100 %
    alert (``spent * 100 >= limit * 100``) had not fired: the figure is cut toward zero, so it
    reaches a threshold exactly when the alert does."""
    spec = BudgetSpec(scope="tenant", subject="t", period="day", limit_usd=Decimal("10"), mode="alert")
    burn = Burn(
        budget_id=uuid.uuid4(),
        spec=spec,
        window_start=datetime(2026, 12, 6, tzinfo=UTC),
        spent_usd=Decimal(spent),
        reserved_usd=Decimal(0),
    )
    assert str(burn.percent) == shown
    assert budget_row(burn)[-1] == shown
    for threshold in (50, 80, 100):
        alert_fires = burn.spent_usd * 100 >= spec.limit_usd * threshold
        assert (burn.percent >= threshold) == alert_fires
