"""The pricing rule's algebra: linear within a tier (so sums of calls reprice exactly), and
the tier chosen per call, never by a sum."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from flowledger.adapters.llm import load_price_table
from flowledger.domain.pricing import LONG_CONTEXT_TOKENS, TokenCounts, cost_of

SONNET = replace(
    load_price_table().price_for("claude-sonnet-4.5"),
    input_cost_per_audio_token=Decimal("4e-5"),
    output_cost_per_audio_token=Decimal("8e-5"),
)
"""Claude's prices with audio rates (as gpt-4o-audio-preview's), so every token type has its own."""


@st.composite
def calls(draw: st.DrawFn, *, long: bool) -> TokenCounts:
    low, high = (LONG_CONTEXT_TOKENS + 1, 1_000_000) if long else (0, LONG_CONTEXT_TOKENS)
    total = draw(st.integers(low, high))
    read = draw(st.integers(0, total))
    written = draw(st.integers(0, total - read))
    output = draw(st.integers(0, 50_000))
    reasoning = draw(st.integers(0, output))
    return TokenCounts(
        input_tokens=total,
        output_tokens=output,
        cache_read_input_tokens=read,
        cache_creation_input_tokens=written,
        cache_creation_1h_input_tokens=draw(st.integers(0, written)),
        reasoning_output_tokens=reasoning,
        audio_input_tokens=draw(st.integers(0, total - read - written)),
        audio_output_tokens=draw(st.integers(0, output - reasoning)),
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


@given(calls(long=False))
def test_a_calls_most_covers_it_however_its_tokens_are_split(call: TokenCounts) -> None:
    # A budget hold is the most a prompt and cap can cost: no split of them costs more
    assert SONNET.most(input_tokens=call.input_tokens, output_tokens=call.output_tokens) >= cost_of(
        call, SONNET
    )
