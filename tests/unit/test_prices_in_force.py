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


def test_a_what_ifs_model_is_found_by_any_name_a_call_is_priced_by_and_only_while_in_force() -> None:
    table = PriceTable(
        version="t",
        prices={"gpt-4.1": price("0.001")},
        schedule={
            "coming": [DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.003"))]
        },
        aliases={"azure/prod": "gpt-4.1"},
    )

    assert table.key_in_force("openai/gpt-4.1", NOW) == "gpt-4.1"
    assert table.key_in_force("gpt-4.1-2025-04-14", NOW) == "gpt-4.1"
    assert table.key_in_force("azure/prod", NOW) == "gpt-4.1"
    assert table.key_in_force("coming", NOW) is None  # priced from next year only
    assert table.key_in_force("nosuch", NOW) is None
