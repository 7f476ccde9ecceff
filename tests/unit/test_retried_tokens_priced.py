"""A call recorded elsewhere with ``retried_tokens`` (REST's ``usage``, ``record_step``) has its
retried attempts priced like its answer: when the server prices a usage that states no cost,
and when a repricing prices it anew. They were left at $0, or at the old price."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from flowledger.domain.pricing import ModelPrice, PriceTable
from flowledger.domain.values import LlmUsage
from flowledger.projections.repricing import Repricing, call_cost

AT = datetime(2026, 12, 1, tzinfo=UTC)
GPT = ModelPrice(input_cost_per_token=Decimal("2e-6"), output_cost_per_token=Decimal("8e-6"))
TABLE = PriceTable(version="t1", prices={"gpt-4.1": GPT})
# 1,000 x $2/M + 100 x $8/M
ANSWER_USD = Decimal("0.0028")


def _retried_usage(**given: object) -> LlmUsage:
    """A step answered at the second attempt; the first was billed for the same tokens."""
    return LlmUsage(
        provider="openai",
        request_model="gpt-4.1",
        input_tokens=1_000,
        output_tokens=100,
        attempts=2,
        retried_tokens={"input_tokens": 1_000, "output_tokens": 100},
        **given,  # type: ignore[arg-type]
    )


def test_a_usage_that_states_no_cost_has_its_retried_attempts_priced_too() -> None:
    # Given a usage with the retried attempt's tokens and no cost (REST prices it by the table)
    priced = TABLE.price_usage(_retried_usage(), AT)
    # Then both attempts are billed: the dashboard's cost is $0.0056, not the answer's $0.0028
    assert priced is not None
    assert (priced.cost_usd, priced.retried_cost_usd, priced.charged_usd) == (
        ANSWER_USD,
        ANSWER_USD,
        2 * ANSWER_USD,
    )


def test_a_retried_cost_the_caller_stated_is_kept() -> None:
    priced = TABLE.price_usage(_retried_usage(retried_cost_usd=Decimal("0.001")), AT)
    assert priced is not None
    assert priced.retried_cost_usd == Decimal("0.001")


def test_a_repricing_prices_the_retried_tokens_of_a_call_without_an_attempt_log() -> None:
    # Given a call recorded elsewhere at $0.0028 + $0.0028 (no attempt log: not the adapter's)
    recorded = _retried_usage(cost_usd=ANSWER_USD, retried_cost_usd=ANSWER_USD, price_version="t0")
    # When a repricing halves every price
    half = ModelPrice(input_cost_per_token=Decimal("1e-6"), output_cost_per_token=Decimal("4e-6"))
    repricing = Repricing(AT, PriceTable(version="t2", prices={"gpt-4.1": half}), "t2.json")
    repriced = call_cost(recorded, AT, [repricing])
    # Then the retried attempt is repriced with the answer: $0.0028 in all, not $0.0014 + $0.0028
    assert (repriced.cost_usd, repriced.retried_cost_usd) == (Decimal("0.0014"), Decimal("0.0014"))
