"""Reading a reply's token counts: whole numbers as the providers send them, and counts that
cannot be read named, never read as 0."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from flowledger.adapters.llm import load_price_table
from flowledger.adapters.llm.reported_usage import parse_usage


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 200}},
        {
            "prompt_tokens": 1000.0,
            "completion_tokens": 100.0,
            "prompt_tokens_details": {"cached_tokens": 200.0},
        },
        {
            "prompt_tokens": "1000",
            "completion_tokens": "100",
            "prompt_tokens_details": {"cached_tokens": "200"},
        },
    ],
    ids=["integers", "integer-valued floats", "digit strings"],
)
def test_whole_counts_are_read_as_integers_whether_sent_as_integers_floats_or_digits(usage: Any) -> None:
    parsed = parse_usage(usage)
    assert (parsed.input_tokens, parsed.output_tokens, parsed.cache_read_input_tokens) == (1000, 100, 200)
    assert all(type(count) is int for count in parsed.counts().values())
    assert parsed.unreadable == ()


@pytest.mark.parametrize(
    "count", [-1, 10.5, -3.0, float("nan"), float("inf"), True, "ten", "1e3", "-5", "10.0", "", [], {}]
)
def test_a_count_that_cannot_be_read_is_named_not_read_as_zero(count: Any) -> None:
    parsed = parse_usage({"prompt_tokens": count, "completion_tokens": 100})
    assert parsed.reported is True
    assert parsed.unreadable == ("prompt_tokens",)
    assert parsed.output_tokens == 100


@pytest.mark.parametrize(
    ("usage", "unreadable"),
    [
        (
            {"input_tokens": 5.0, "output_tokens": "7", "cache_read_input_tokens": -1},
            ("cache_read_input_tokens",),
        ),
        ({"promptTokenCount": 3, "candidatesTokenCount": 1.5}, ("candidatesTokenCount",)),
        (
            {"input_tokens": 4, "output_tokens": 2, "input_tokens_details": {"cached_tokens": "x"}},
            ("cached_tokens",),
        ),
        (
            {
                "prompt_tokens": 1,
                "completion_tokens": 2,
                "completion_tokens_details": {"reasoning_tokens": False},
            },
            ("reasoning_tokens",),
        ),
    ],
    ids=["anthropic", "gemini", "openai responses", "openai chat"],
)
def test_an_unreadable_count_is_named_in_every_usage_shape(usage: Any, unreadable: tuple[str, ...]) -> None:
    assert parse_usage(usage).unreadable == unreadable


def test_a_count_left_out_or_null_is_none_used_not_unreadable() -> None:
    parsed = parse_usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": None,
            "completion_tokens_details": {"reasoning_tokens": None},
            "cost": None,
        }
    )
    assert (parsed.input_tokens, parsed.output_tokens, parsed.unreadable) == (10, 3, ())
    assert (parsed.cache_read_input_tokens, parsed.reasoning_output_tokens) == (0, 0)


def test_a_count_every_reply_of_its_shape_carries_left_out_or_null_is_not_known() -> None:
    # (completion_tokens null was read as 0 output tokens: the call priced at its prompt alone)
    parsed = parse_usage({"prompt_tokens": 10, "completion_tokens": None})
    assert (parsed.input_tokens, parsed.output_tokens, parsed.unreadable) == (10, 0, ("completion_tokens",))


@pytest.mark.parametrize(
    "usage",
    [
        # DeepSeek's own API: the cache hits only as prompt_cache_hit_tokens (and the misses).
        {
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "prompt_cache_hit_tokens": 600,
            "prompt_cache_miss_tokens": 400,
        },
        # Newer replies name them in OpenAI's field as well: counted once.
        {
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 600},
            "prompt_cache_hit_tokens": 600,
            "prompt_cache_miss_tokens": 400,
        },
    ],
    ids=["deepseek fields", "both"],
)
def test_deepseek_cache_hits_are_read_as_cache_reads(usage: Any) -> None:
    # They were not read: 600 cached tokens of deepseek-v3.2 charged at the input price, the
    # call $0.0002842 instead of $0.0001330 (cache reads cost a tenth).
    parsed = parse_usage(usage)
    assert (parsed.input_tokens, parsed.cache_read_input_tokens, parsed.output_tokens) == (1000, 600, 10)
    assert parsed.unreadable == ()
    price = load_price_table().price_for("deepseek-v3.2")
    assert price is not None
    # 400 x $0.28/M + 600 x $0.028/M + 10 x $0.42/M
    assert price.cost(**parsed.counts()) == Decimal("0.000112") + Decimal("0.0000168") + Decimal("0.0000042")


def _thinking(prompt: int, completion: int, reasoning: int, total: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    return usage if total is None else {**usage, "total_tokens": total}


@pytest.mark.parametrize(
    ("usage", "output", "reasoning"),
    [
        # A Gemini thinking model through a proxy (CLIProxyAPI, Portkey, Envoy's AI gateway sent
        # it so): the thoughts are in the details and the total, not in completion_tokens.
        (_thinking(21, 0, 60, total=81), 60, 60),
        (_thinking(100, 40, 50, total=190), 90, 50),
        # OpenAI's own: completion_tokens holds the reasoning, and the total says so.
        (_thinking(100, 90, 50, total=190), 90, 50),
        # No total to tell: completion_tokens is taken as OpenAI means it.
        (_thinking(100, 90, 50, total=None), 90, 50),
        (_thinking(21, 0, 60, total=None), 0, 0),
    ],
    ids=["no visible output", "thoughts beside the answer", "openai", "no total", "no total, clamped"],
)
def test_reasoning_that_the_total_shows_outside_completion_tokens_is_counted_as_output(
    usage: dict[str, Any], output: int, reasoning: int
) -> None:
    # Reasoning past completion_tokens was clamped to it: gemini-2.5-flash's 60 thinking tokens
    # reported as {"completion_tokens": 0, "reasoning_tokens": 60, "total_tokens": 81} cost $0
    # of output (and a budget was charged the prompt alone); 50 beside 40 of answer, 40.
    parsed = parse_usage(usage)
    assert (parsed.output_tokens, parsed.reasoning_output_tokens) == (output, reasoning)
    assert parsed.unreadable == ()
    price = load_price_table().price_for("gemini-2.5-flash")
    assert price is not None
    expected = parsed.input_tokens * Decimal("0.0000003") + output * Decimal("0.0000025")
    assert price.cost(**parsed.counts()) == expected


@pytest.mark.parametrize(
    ("usage", "output", "reasoning", "unreadable"),
    [
        # any-llm's Gemini usage: 405 thoughts in the total only, none in completion_tokens
        ({"prompt_tokens": 20, "completion_tokens": 198, "total_tokens": 623}, 603, 405, ()),
        (
            {"input_tokens": 20, "input_tokens_details": {}, "output_tokens": 198, "total_tokens": 623},
            603,
            405,
            (),
        ),
        # A total that adds up, or falls short, or is not a count: nothing is added
        ({"prompt_tokens": 20, "completion_tokens": 198, "total_tokens": 218}, 198, 0, ()),
        ({"prompt_tokens": 20, "completion_tokens": 198, "total_tokens": 100}, 198, 0, ()),
        ({"prompt_tokens": 20, "completion_tokens": 198, "total_tokens": -5}, 198, 0, ()),
        # A prompt that cannot be read stands as 0: its tokens are not taken for reasoning
        (
            {"prompt_tokens": "many", "completion_tokens": 198, "total_tokens": 623},
            198,
            0,
            ("prompt_tokens",),
        ),
    ],
    ids=["chat", "responses", "adds up", "short", "not a count", "prompt unreadable"],
)
def test_a_total_past_prompt_and_completion_with_no_reasoning_count_is_reasoning_left_out(
    usage: dict[str, Any], output: int, reasoning: int, unreadable: tuple[str, ...]
) -> None:
    # Read as the two counts alone, 405 thinking tokens Google bills at the output rate cost $0
    parsed = parse_usage(usage)
    assert (parsed.output_tokens, parsed.reasoning_output_tokens) == (output, reasoning)
    assert parsed.unreadable == unreadable
    if not unreadable:
        price = load_price_table().price_for("gemini-2.5-flash")
        expected = 20 * Decimal("0.0000003") + output * Decimal("0.0000025")
        assert price.cost(**parsed.counts()) == expected


@pytest.mark.parametrize(
    ("total", "output"),
    [(81, 60), (21, 0), (None, 0)],
    ids=["total with the thoughts", "openai's total", "no total"],
)
def test_reasoning_the_total_shows_outside_output_tokens_is_counted_in_the_responses_shape(
    total: int | None, output: int
) -> None:
    # A Gemini proxy's Responses usage (CLIProxyAPI sent it so): 60 thoughts in the details and
    # the total, output_tokens 0; they were clamped to 0 and billed as no output
    usage: dict[str, Any] = {
        "input_tokens": 21,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 60},
    }
    if total is not None:
        usage["total_tokens"] = total
    parsed = parse_usage(usage)
    assert (parsed.output_tokens, parsed.reasoning_output_tokens) == (output, output)
    assert parsed.unreadable == ()
