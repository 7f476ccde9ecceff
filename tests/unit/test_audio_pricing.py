"""Audio tokens are priced at their own rates (LiteLLM's ``input_cost_per_audio_token`` and
``output_cost_per_audio_token``), read from OpenAI's and Gemini's usage, held by a budget's
estimate and repriced from the stored event; usage stored before them reads as it did."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.reported_usage import parse_usage
from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import ModelPrice, PriceTable, TokenCounts
from flowledger.domain.session_views import Totals
from flowledger.domain.values import LlmUsage
from flowledger.projections.repricing import Repricing, call_cost

# gpt-4o-audio-preview as LiteLLM prices it: text $2.50/M in, $10/M out; audio $40/M in, $80/M out
AUDIO_ENTRY = {
    "input_cost_per_token": 2.5e-06,
    "output_cost_per_token": 1e-05,
    "input_cost_per_audio_token": 4e-05,
    "output_cost_per_audio_token": 8e-05,
    "litellm_provider": "openai",
    "mode": "chat",
}
AUDIO_PRICE = ModelPrice.from_entry(AUDIO_ENTRY)
TEXT_ONLY = ModelPrice(input_cost_per_token=Decimal("2.5e-6"), output_cost_per_token=Decimal("1e-5"))

OPENAI_AUDIO_USAGE = {
    "prompt_tokens": 1_200,
    "completion_tokens": 600,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 1_000},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 500},
}
# 200 text in x $2.50/M + 1,000 audio in x $40/M + 100 text out x $10/M + 500 audio out x $80/M
# = 0.0005 + 0.04 + 0.001 + 0.04
OPENAI_AUDIO_COST = Decimal("0.0815")


def _prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "model_prices_and_context_window.json"
    path.write_text(json.dumps({"gpt-4o-audio-preview": AUDIO_ENTRY}))
    return path


def _client(tmp_path: Path, body: dict[str, Any] | None = None) -> OpenAICompatibleClient:
    config = ClientConfig(
        base_url="http://llm.test/v1", api_key=ApiKey("sk-test-0123456789"), transport="httpx", max_tokens=600
    )
    return OpenAICompatibleClient(
        config,
        prices=load_price_table(_prices_file(tmp_path)),
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=body)),
        now=lambda: datetime(2026, 11, 30, 12, tzinfo=UTC),
    )


async def test_an_openai_audio_call_is_priced_at_the_audio_rates(tmp_path: Path) -> None:
    # Given a gpt-4o-audio-preview reply whose usage names 1,000 audio prompt tokens and
    # 500 audio completion tokens
    body = {
        "id": "r-1",
        "model": "gpt-4o-audio-preview",
        "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
        "usage": OPENAI_AUDIO_USAGE,
    }
    # When the call is made
    async with _client(tmp_path, body) as llm:
        reply = await llm.complete(model="gpt-4o-audio-preview", messages=[{"role": "user", "content": "hi"}])
    u = reply.usage
    # Then the audio counts are recorded apart, and priced at their own rates
    assert (u.input_tokens, u.audio_input_tokens, u.output_tokens, u.audio_output_tokens) == (
        1_200,
        1_000,
        600,
        500,
    )
    assert u.cost_usd == OPENAI_AUDIO_COST
    # (at the text rates, as before, it was 1,200 x $2.50/M + 600 x $10/M = $0.009: 9x under)
    assert TEXT_ONLY.cost(input_tokens=1_200, output_tokens=600) == Decimal("0.009")
    # And the stored usage carries them
    assert LlmUsage.from_dict(u.to_dict()) == u


def test_a_price_without_audio_rates_prices_audio_at_the_text_rates() -> None:
    # Given a price with no audio keys
    # When an audio call is priced at it
    cost = TEXT_ONLY.cost(
        input_tokens=1_200, output_tokens=600, audio_input_tokens=1_000, audio_output_tokens=500
    )
    # Then the audio tokens fall back to the input and output rates
    assert cost == TEXT_ONLY.cost(input_tokens=1_200, output_tokens=600) == Decimal("0.009")
    # And the LiteLLM keys are read when the entry has them
    assert AUDIO_PRICE.input_cost_per_audio_token == Decimal("0.00004")
    assert AUDIO_PRICE.output_cost_per_audio_token == Decimal("0.00008")
    assert TEXT_ONLY.input_cost_per_audio_token is None


def test_a_budget_hold_covers_an_all_audio_call() -> None:
    # Given a model whose audio input costs 16x its text input
    # When the most a 10,000-token prompt with a 600-token cap can cost is asked
    most = AUDIO_PRICE.most(input_tokens=10_000, output_tokens=600)
    # Then it is the call all in audio: 10,000 x $40/M + 600 x $80/M
    all_audio = AUDIO_PRICE.cost(
        input_tokens=10_000, output_tokens=600, audio_input_tokens=10_000, audio_output_tokens=600
    )
    assert most == all_audio == Decimal("0.448")
    # (held at the text rates it was 10,000 x $2.50/M + 600 x $10/M = $0.031)
    assert AUDIO_PRICE.cost(input_tokens=10_000, output_tokens=600) == Decimal("0.031")


def test_a_clients_estimate_holds_a_prompt_answered_in_audio(tmp_path: Path) -> None:
    # Given a client pricing gpt-4o-audio-preview with a 600-token cap
    llm = _client(tmp_path)
    # When its most for a prompt is estimated (what a budget reserves)
    estimate = llm.max_cost("gpt-4o-audio-preview", [{"role": "user", "content": "x" * 4_000}])
    # Then it covers the whole prompt and cap in audio
    prompt = estimate.prompt_tokens
    assert estimate.max_cost_usd == AUDIO_PRICE.cost(
        input_tokens=prompt, output_tokens=600, audio_input_tokens=prompt, audio_output_tokens=600
    )


def test_an_audio_call_is_repriced_from_its_event() -> None:
    # Given an audio call recorded at the text rate (an older price table)
    usage = LlmUsage(
        provider="openai",
        request_model="gpt-4o-audio-preview",
        input_tokens=1_200,
        output_tokens=600,
        audio_input_tokens=1_000,
        audio_output_tokens=500,
        cost_usd=Decimal("0.009"),
        price_version="old",
    )
    repricing = Repricing(
        datetime(2026, 1, 1, tzinfo=UTC),
        PriceTable(version="audio", prices={"gpt-4o-audio-preview": AUDIO_PRICE}),
        "audio.json",
    )
    # When it is repriced (as the cost projection reads it from the stored event)
    stored = LlmUsage.from_dict(json.loads(json.dumps(usage.to_dict())))
    repriced = call_cost(stored, datetime(2026, 12, 1, tzinfo=UTC), [repricing])
    # Then the audio tokens take the audio rates
    assert (repriced.cost_usd, repriced.price_version) == (OPENAI_AUDIO_COST, "audio")


def test_a_usage_stored_before_audio_tokens_reads_as_it_did() -> None:
    # Given a usage as an older release stored it (no audio keys)
    old = {
        "provider": "openai",
        "request_model": "gpt-4.1",
        "response_model": "gpt-4.1",
        "input_tokens": 812,
        "output_tokens": 40,
        "cache_read_input_tokens": 0,
        "reasoning_output_tokens": 0,
        "finish_reasons": ["stop"],
        "response_id": "r",
        "cost_usd": "0.001944",
        "price_version": "v",
        "latency_ms": 10.0,
        "attempts": 1,
        "extra": {},
    }
    # When it is read
    usage = LlmUsage.from_dict(old)
    # Then it has no audio tokens, writes back as it was stored, and totals the same
    assert (usage.audio_input_tokens, usage.audio_output_tokens) == (0, 0)
    assert usage.to_dict() == old
    totals = Totals().add(usage)
    assert (totals.input_tokens, totals.audio_input_tokens, totals.audio_output_tokens) == (812, 0, 0)
    # And set, they are written and summed
    audio = LlmUsage.from_dict({**old, "audio_input_tokens": 800, "audio_output_tokens": 30})
    assert audio.to_dict()["audio_input_tokens"] == 800
    assert (Totals().add(audio).add(audio).audio_input_tokens, Totals().add(audio).audio_output_tokens) == (
        1_600,
        30,
    )


@pytest.mark.parametrize(
    ("counts", "field"),
    [
        ({"input_tokens": 100, "output_tokens": 0, "audio_input_tokens": 101}, "audio_input_tokens"),
        (
            {
                "input_tokens": 100,
                "output_tokens": 0,
                "cache_read_input_tokens": 60,
                "audio_input_tokens": 41,
            },
            "audio_input_tokens",
        ),
        ({"input_tokens": 0, "output_tokens": 10, "audio_output_tokens": 11}, "audio_output_tokens"),
        (
            {"input_tokens": 0, "output_tokens": 10, "reasoning_output_tokens": 5, "audio_output_tokens": 6},
            "audio_output_tokens",
        ),
        ({"input_tokens": 0, "output_tokens": 0, "audio_output_tokens": -1}, "audio_output_tokens"),
    ],
)
def test_audio_counts_past_what_they_are_part_of_are_refused(counts: dict[str, int], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        TokenCounts(**counts)
    assert raised.value.field == field
    with pytest.raises(ValidationError) as raised:
        LlmUsage(**counts)
    assert raised.value.field == f"usage.{field}"


def test_gemini_audio_modalities_are_read_apart_from_the_cached_ones() -> None:
    # Given Gemini usage whose prompt holds 3,000 audio tokens, 1,000 of them cached, and
    # whose answer holds 400 audio tokens
    usage = {
        "promptTokenCount": 5_000,
        "cachedContentTokenCount": 2_000,
        "candidatesTokenCount": 500,
        "promptTokensDetails": [
            {"modality": "TEXT", "tokenCount": 2_000},
            {"modality": "AUDIO", "tokenCount": 3_000},
        ],
        "cacheTokensDetails": [
            {"modality": "TEXT", "tokenCount": 1_000},
            {"modality": "AUDIO", "tokenCount": 1_000},
        ],
        "candidatesTokensDetails": [
            {"modality": "TEXT", "tokenCount": 100},
            {"modality": "AUDIO", "tokenCount": 400},
        ],
    }
    # When it is read (camelCase, and the SDK's snake_case)
    camel = parse_usage(usage)
    snake = parse_usage(
        {
            "prompt_token_count": 5_000,
            "cached_content_token_count": 2_000,
            "candidates_token_count": 500,
            "prompt_tokens_details": [{"modality": "AUDIO", "token_count": 3_000}],
            "cache_tokens_details": [{"modality": "AUDIO", "token_count": 1_000}],
            "candidates_tokens_details": [{"modality": "AUDIO", "token_count": 400}],
        }
    )
    # Then the uncached audio input and the audio output are split out
    for read in (camel, snake):
        assert (read.input_tokens, read.cache_read_input_tokens, read.audio_input_tokens) == (
            5_000,
            2_000,
            2_000,
        )
        assert (read.output_tokens, read.audio_output_tokens) == (500, 400)
        assert read.unreadable == ()


def test_audio_counts_past_their_totals_are_clamped_and_unreadable_ones_named() -> None:
    # Given an OpenAI usage claiming more audio than the prompt and answer hold
    read = parse_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 40, "audio_tokens": 90},
            "completion_tokens_details": {"reasoning_tokens": 4, "audio_tokens": "lots"},
        }
    )
    # Then the audio input is what is left past the cache reads, and the unreadable count named
    assert (read.audio_input_tokens, read.audio_output_tokens) == (60, 0)
    assert read.unreadable == ("audio_tokens",)
    TokenCounts(**read.counts())  # a reply never makes the counts invalid
