"""``prices reprice``'s dry run adds and subtracts money exactly, whatever the thread's decimal
context, as the applied projection (PostgreSQL numeric) does."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext

from flowledger.domain.pricing import ModelPrice, PriceTable
from flowledger.domain.values import LlmUsage
from flowledger.projections.repricing import CallCost, Repricing, changes

AT = datetime(2026, 12, 1, 12, tzinfo=UTC)
PRICE = ModelPrice(input_cost_per_token=Decimal("0.00000123456789"), output_cost_per_token=Decimal("1e-6"))
REPRICING = Repricing(
    datetime(2026, 12, 1, tzinfo=UTC), PriceTable(version="new", prices={"m": PRICE}), "new.json"
)


def test_the_dry_runs_sums_and_changes_are_exact_under_a_narrow_decimal_context() -> None:
    # Given two calls recorded at $1234.000001 and $0.0000001 (the second's retried attempt too)
    calls = [
        LlmUsage(provider="p", request_model="m", input_tokens=1, cost_usd=Decimal("1234.000001")),
        LlmUsage(
            provider="p",
            request_model="m",
            input_tokens=1,
            cost_usd=Decimal("0.0000001"),
            retried_cost_usd=Decimal("0.0000001"),
            attempts=2,
        ),
    ]
    # When the dry run works out the change in a thread whose context keeps 6 digits
    with localcontext() as context:
        context.prec = 6
        [change] = changes(iter([("m", AT, u) for u in calls]), [], REPRICING)
        charged = CallCost(Decimal("1234.000001"), Decimal("0.0000001"), False, "v").charged_usd
    # Then every figure is exact (before read 1234.00: rounded to 6 digits)
    assert change.before_usd == Decimal("1234.0000012")
    # (the retried attempt, with no tokens to reprice, keeps its recorded $0.0000001)
    after = Decimal("0.00000256913578")
    assert change.after_usd == after
    assert change.change_usd == Decimal("-1233.99999863086422")
    assert charged == Decimal("1234.0000011")
