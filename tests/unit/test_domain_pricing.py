"""The domain's one pricing rule, and the adapter and projections that use it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

import pytest

from flowledger.adapters import llm as llm_adapter
from flowledger.adapters.llm import load_price_table
from flowledger.adapters.llm import pricing as adapter_pricing
from flowledger.domain.errors import UnknownModelPrice, ValidationError
from flowledger.domain.pricing import ModelPrice, PriceTable, TokenCounts, cost_of
from flowledger.projections import Price, reprice

GPT = ModelPrice(
    input_cost_per_token=Decimal("2e-6"),
    output_cost_per_token=Decimal("8e-6"),
    cache_read_input_token_cost=Decimal("5e-7"),
)


def test_each_token_type_is_priced_at_its_own_rate_never_the_total_at_the_output_price() -> None:
    tokens = TokenCounts(input_tokens=12_000, output_tokens=850, cache_read_input_tokens=9_000)
    # 3,000 x 2e-6 + 9,000 x 5e-7 + 850 x 8e-6
    assert cost_of(tokens, GPT) == Decimal("0.0173")
    assert GPT.cost(input_tokens=12_000, output_tokens=850, cache_read_input_tokens=9_000) == Decimal(
        "0.0173"
    )


def test_the_cost_of_summed_tokens_is_the_sum_of_the_costs() -> None:
    calls = [
        TokenCounts(
            input_tokens=100, output_tokens=40, cache_read_input_tokens=60, reasoning_output_tokens=10
        ),
        TokenCounts(input_tokens=7, output_tokens=3),
    ]
    summed = TokenCounts(
        input_tokens=107, output_tokens=43, cache_read_input_tokens=60, reasoning_output_tokens=10
    )
    assert cost_of(summed, GPT) == sum((cost_of(c, GPT) for c in calls), Decimal(0))


def test_a_cost_is_an_exact_decimal() -> None:
    assert isinstance(cost_of(TokenCounts(input_tokens=1, output_tokens=1), GPT), Decimal)


@pytest.mark.parametrize(
    ("counts", "field"),
    [
        ({"input_tokens": -1, "output_tokens": 0}, "input_tokens"),
        ({"input_tokens": 1.5, "output_tokens": 0}, "input_tokens"),
        ({"input_tokens": 10, "output_tokens": 0, "cache_read_input_tokens": 11}, "cache_read_input_tokens"),
        ({"input_tokens": 0, "output_tokens": 5, "reasoning_output_tokens": 6}, "reasoning_output_tokens"),
    ],
)
def test_impossible_token_counts_are_a_validation_error(counts: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=f"^{field}: ") as raised:
        TokenCounts(**counts)
    assert raised.value.field == field


def test_a_price_entry_that_is_not_a_number_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as raised:
        ModelPrice.from_entry({"input_cost_per_token": "cheap", "output_cost_per_token": 1})
    assert raised.value.field == "price.input_cost_per_token"


def test_a_table_finds_a_provider_prefixed_model_and_refuses_an_unknown_one() -> None:
    table = PriceTable(version="v1", prices={"gpt-4.1": GPT})
    assert table.price_for("openai/gpt-4.1") is GPT
    with pytest.raises(UnknownModelPrice, match=r"no price for model 'mystery' in price table 'v1'"):
        table.price_for("mystery")


def test_the_adapter_names_are_the_domain_classes() -> None:
    assert llm_adapter.ModelPrice is adapter_pricing.ModelPrice is ModelPrice
    assert llm_adapter.PriceTable is adapter_pricing.PriceTable is PriceTable
    assert adapter_pricing.load_price_table().price_for("gpt-4.1").cost(
        input_tokens=1000, output_tokens=0
    ) == Decimal("0.002")


def test_a_projection_price_is_the_domain_price_under_other_names() -> None:
    assert Price(Decimal("2e-6"), Decimal("8e-6"), Decimal("5e-7")).model_price() == GPT


def test_repricing_as_a_model_without_a_price_is_a_validation_error_not_a_key_error() -> None:
    # The check comes before any query, so no connection is needed.
    no_connection = cast(Any, None)
    with pytest.raises(ValidationError) as raised:
        reprice(
            no_connection,
            "reader",
            {"gpt-4.1": GPT},
            as_model="claude",
            since=cast(Any, None),
            tenant="default",
        )
    assert raised.value.field == "as_model"


@pytest.mark.parametrize(
    ("field", "make"),
    [
        # Each was taken, and every call it priced then failed with a bare TypeError or
        # AttributeError (an outside probe)
        (
            "price.input_cost_per_token",
            lambda: ModelPrice(input_cost_per_token=None, output_cost_per_token=Decimal(1)),
        ),
        (
            "price.output_cost_per_token",
            lambda: ModelPrice(input_cost_per_token=Decimal(1), output_cost_per_token=None),
        ),
        ("prices", lambda: PriceTable(version="v", prices=5)),
        ("prices", lambda: PriceTable(version="v", prices={"gpt-4.1": 5})),
        ("prices", lambda: PriceTable(version="v", prices={5: GPT})),
        ("default", lambda: PriceTable(version="v", prices={}, default=5)),
        ("pricing_file", lambda: load_price_table(5)),
    ],
    ids=["input None", "output None", "prices 5", "a price 5", "a model 5", "default 5", "file 5"],
)
def test_a_price_or_table_that_is_none_is_refused_naming_it(field: str, make: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        make()
    assert refused.value.field == field
