"""Money read from the dashboards is added, subtracted and shown exactly, whatever the thread's
decimal context: the default keeps 28 significant digits, and an embedding service may have set
``getcontext().prec = 6``. Costs may have up to 40 decimals."""

from __future__ import annotations

from decimal import Decimal, localcontext

from flowledger.domain.values import exact_decimal
from flowledger.projections import RepriceRow

FORTY_DECIMALS = Decimal("0.1234567890123456789012345678901234567891")


def test_the_difference_of_a_repricing_is_exact_in_a_thread_that_keeps_six_digits() -> None:
    row = RepriceRow(
        group=("gpt-4.1",),
        calls=1,
        priced_calls=1,
        recorded_cost_usd=Decimal("0.0012345678"),
        repriced_cost_usd=Decimal("1.0000000001"),
    )
    with localcontext(prec=6):
        difference = row.difference_usd
    assert difference == Decimal("0.9987654323")


def test_a_cost_of_forty_decimals_is_shown_to_its_last_decimal() -> None:
    # It showed 0.1234567890123456789012345679: normalize() rounded to the context's 28 digits
    assert exact_decimal(FORTY_DECIMALS, 4) == str(FORTY_DECIMALS)
    assert exact_decimal(Decimal("1234567.50000"), 4, grouping=True) == "1,234,567.5000"
