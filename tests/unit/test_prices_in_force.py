"""What-ifs price at the entries in force, never at one that takes effect later: ``--reprice-as``
and the tier what-ifs read ``PriceTable.latest()`` / ``price_for(at=None)``, the newest entry of
a scheduled model, so a price announced for next month already repriced this month's calls."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from flowledger.domain.price_table import DatedPrice, PriceTable
from flowledger.domain.pricing import ModelPrice

NOW = datetime(2026, 12, 5, tzinfo=UTC)


def price(per_token: str) -> ModelPrice:
    return ModelPrice(input_cost_per_token=Decimal(per_token), output_cost_per_token=Decimal(per_token))


def test_in_force_takes_each_models_entry_at_the_moment_and_leaves_out_models_not_priced_yet() -> None:
    table = PriceTable(
        version="t",
        prices={"plain": price("0.001")},
        schedule={
            "cut": [
                DatedPrice(effective_from=datetime(2026, 1, 1, tzinfo=UTC), price=price("0.002")),
                DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.0001")),
            ],
            "coming": [DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.003"))],
        },
    )

    in_force = table.in_force(NOW)

    assert in_force == {"plain": price("0.001"), "cut": price("0.002")}
    assert table.latest()["cut"] == price("0.0001")  # what the what-ifs used to price with
