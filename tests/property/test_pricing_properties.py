"""The pricing rule's algebra: linear within a tier (so sums of calls reprice exactly), and
the tier chosen per call, never by a sum."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from flowledger.adapters.llm import load_price_table
from flowledger.domain.pricing import LONG_CONTEXT_TOKENS, TokenCounts, cost_of

SONNET = load_price_table().price_for("claude-sonnet-4.5")


@st.composite
def calls(draw: st.DrawFn, *, long: bool) -> TokenCounts:
    low, high = (LONG_CONTEXT_TOKENS + 1, 1_000_000) if long else (0, LONG_CONTEXT_TOKENS)
    total = draw(st.integers(low, high))
    read = draw(st.integers(0, total))
    written = draw(st.integers(0, total - read))
    output = draw(st.integers(0, 50_000))
    return TokenCounts(
        input_tokens=total,
        output_tokens=output,
        cache_read_input_tokens=read,
        cache_creation_input_tokens=written,
        cache_creation_1h_input_tokens=draw(st.integers(0, written)),
        reasoning_output_tokens=draw(st.integers(0, output)),
    )


def summed(counts: list[TokenCounts]) -> TokenCounts:
    names = TokenCounts.__dataclass_fields__
    return TokenCounts(**{name: sum(getattr(c, name) for c in counts) for name in names})


@given(st.booleans().flatmap(lambda long: st.tuples(st.just(long), st.lists(calls(long=long), max_size=8))))
def test_the_cost_of_summed_calls_of_one_tier_is_the_sum_of_their_costs(
    case: tuple[bool, list[TokenCounts]],
) -> None:
    long, counts = case
    each = sum((cost_of(c, SONNET) for c in counts), Decimal(0))
    assert cost_of(summed(counts), SONNET, long_context=long) == each


@given(calls(long=False), calls(long=True))
def test_a_long_call_never_costs_less_than_the_same_tokens_at_the_base_rates(
    short: TokenCounts, long: TokenCounts
) -> None:
    assert cost_of(long, SONNET) >= cost_of(long, SONNET, long_context=False)
    assert cost_of(short, SONNET) == cost_of(short, SONNET, long_context=False)
