"""An OpenRouter ``:free`` variant costs nothing unless the price table names that variant."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from flowledger.domain.pricing import ModelPrice, PriceTable
from flowledger.domain.values import LlmUsage

PAID = ModelPrice(input_cost_per_token=Decimal("1.3e-7"), output_cost_per_token=Decimal("4e-7"))
NAMED = ModelPrice(input_cost_per_token=Decimal("1e-9"), output_cost_per_token=Decimal("2e-9"))
TABLE = PriceTable(
    version="t",
    prices={"meta-llama/llama-3.3-70b-instruct": PAID, "deepseek-v3.2": PAID, "deepseek-v3.2:free": NAMED},
    aliases={"llama-free-alias:free": "deepseek-v3.2"},
)
AT = datetime(2026, 12, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    "model",
    [
        "meta-llama/llama-3.3-70b-instruct:free",
        "openrouter/meta-llama/llama-3.3-70b-instruct:free",
        " meta-llama/llama-3.3-70b-instruct:free",
    ],
)
def test_a_free_variant_the_table_does_not_name_costs_nothing(model: str) -> None:
    # A million input tokens of the :free variant were charged $0.13, the paid model's price
    price = TABLE.price_for(model, AT)
    assert price.cost(input_tokens=1_000_000, output_tokens=1_000) == 0
    assert TABLE.resolve(model) == "meta-llama/llama-3.3-70b-instruct:free"
    # And the paid model keeps its price
    assert TABLE.price_for("meta-llama/llama-3.3-70b-instruct", AT) == PAID


def test_a_free_variant_the_table_names_is_priced_as_named() -> None:
    assert TABLE.price_for("deepseek-v3.2:free", AT) == NAMED
    assert TABLE.price_for("openrouter/deepseek/deepseek-v3.2:free", AT) == NAMED
    assert TABLE.resolve("deepseek/deepseek-v3.2:free") == "deepseek-v3.2:free"
    assert TABLE.price_for("llama-free-alias:free", AT) == PAID  # an alias naming the variant


def test_a_free_variant_of_a_model_the_table_lacks_costs_nothing_rather_than_the_default() -> None:
    table = PriceTable(version="t", prices={"gpt-4.1": PAID}, default=PAID)
    assert table.price_for("someone/unknown-model:free", AT).cost(input_tokens=1_000, output_tokens=1) == 0
    assert table.price_for("someone/unknown-model", AT) == PAID


def test_a_free_variant_answered_under_its_paid_name_stays_free() -> None:
    # A reply naming the paid model it ran (OpenRouter answers with the model's slug) is the same
    # model, not another one that bills: priced as the variant asked for
    asked = "meta-llama/llama-3.3-70b-instruct:free"
    assert TABLE.billed_model(asked, "meta-llama/llama-3.3-70b-instruct") == TABLE.resolve(asked)
    usage = LlmUsage(
        request_model=asked, response_model="meta-llama/llama-3.3-70b-instruct", input_tokens=1_000_000
    )
    priced = TABLE.price_usage(usage, AT)
    assert priced is not None
    assert priced.cost_usd == 0


def test_a_routing_suffix_other_than_free_still_resolves_to_the_paid_model() -> None:
    assert TABLE.price_for("meta-llama/llama-3.3-70b-instruct:nitro", AT) == PAID
    assert TABLE.price_for("deepseek-v3.2@20250929", AT) == PAID


def test_a_free_variant_of_a_model_the_table_lacks_is_its_own_key() -> None:
    assert TABLE.resolve("someone/unknown-model:free") == "someone/unknown-model:free"
    assert TABLE.resolve("someone/unknown-model") is None
