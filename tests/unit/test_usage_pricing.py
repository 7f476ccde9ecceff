"""Golden usage payloads (OpenAI, Anthropic, Gemini, OpenRouter shapes) priced to hand-computed
values: cache reads, 5-minute and 1-hour cache writes, reasoning, a long-context tier, aliased
and provider-prefixed names, a provider's own charge, effective dates, unpriced models, and
every billed attempt of a call; a repricing prices what was reported, never what was not."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.reported_usage import parse_usage
from flowledger.domain.errors import LlmCallFailed, UnknownModelPrice, ValidationError
from flowledger.domain.pricing import ModelPrice, PriceTable, billed_key
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.projections.repricing import Repricing, call_cost, changes

MESSAGES = [{"role": "user", "content": "where is my order?"}]
Handler = Callable[[httpx.Request], httpx.Response]


def reply(usage: dict[str, Any], *, key: str = "usage", model: str = "m") -> dict[str, Any]:
    return {
        "id": "r-1",
        "model": model,
        "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
        key: usage,
    }


async def _no_wait(_: float) -> None:
    return None


def client(handler: Handler, *, prices_file: Path | None = None, **options: Any) -> OpenAICompatibleClient:
    now = options.pop("now", lambda: datetime(2026, 11, 30, 12, tzinfo=UTC))
    config = ClientConfig(
        base_url="http://llm.test/v1", api_key=ApiKey("sk-test-0123456789"), transport="httpx", **options
    )
    return OpenAICompatibleClient(
        config,
        prices=load_price_table(prices_file),
        transport=httpx.MockTransport(handler),
        retry_sleep=_no_wait,
        now=now,
    )


async def priced(model: str, body: dict[str, Any], **options: Any) -> LlmUsage:
    async with client(lambda request: httpx.Response(200, json=body), **options) as llm:
        return (await llm.complete(model=model, messages=MESSAGES)).usage


ANTHROPIC = {
    "input_tokens": 2_000,
    "cache_read_input_tokens": 10_000,
    "cache_creation_input_tokens": 3_000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1_000, "ephemeral_1h_input_tokens": 2_000},
    "output_tokens": 500,
}
LITELLM_OPENAI_SHAPE = {
    "prompt_tokens": 15_000,
    "completion_tokens": 500,
    "prompt_tokens_details": {"cached_tokens": 10_000},
    "cache_creation_input_tokens": 3_000,
    "cache_creation_token_details": {"ephemeral_5m_input_tokens": 1_000, "ephemeral_1h_input_tokens": 2_000},
}
# claude-sonnet-4.5: 2,000 x $3/M + 10,000 reads x $0.30/M + 1,000 5-minute writes x $3.75/M
# + 2,000 1-hour writes x $6/M + 500 x $15/M = 0.006 + 0.003 + 0.00375 + 0.012 + 0.0075
SONNET_COST = Decimal("0.03225")


@pytest.mark.parametrize("usage", [ANTHROPIC, LITELLM_OPENAI_SHAPE], ids=["anthropic", "openai-litellm"])
async def test_cache_writes_are_priced_at_their_5_minute_and_1_hour_rates_under_a_dated_name(
    usage: dict[str, Any],
) -> None:
    u = await priced("claude-sonnet-4-5-20250929", reply(usage))
    assert (u.input_tokens, u.cache_read_input_tokens, u.output_tokens) == (15_000, 10_000, 500)
    assert (u.cache_creation_input_tokens, u.cache_creation_1h_input_tokens) == (3_000, 2_000)
    assert u.cost_usd == SONNET_COST
    # The undercount the issue names: 1-hour writes at the 5-minute rate would be 0.02775.
    assert u.cost_usd - Decimal("0.02775") == 2_000 * (Decimal("6e-6") - Decimal("3.75e-6"))
    assert not u.unpriced


async def test_a_call_past_200k_input_tokens_takes_every_long_context_rate() -> None:
    usage = {
        "input_tokens": 150_000,
        "cache_read_input_tokens": 60_000,
        "cache_creation_input_tokens": 10_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 4_000, "ephemeral_1h_input_tokens": 6_000},
        "output_tokens": 2_000,
    }
    u = await priced("anthropic/claude-sonnet-4-5", reply(usage))
    assert u.input_tokens == 220_000
    # 150,000 x $6/M + 60,000 x $0.60/M + 4,000 x $7.50/M + 6,000 x $12/M + 2,000 x $22.50/M
    assert u.cost_usd == Decimal("0.9") + Decimal("0.036") + Decimal("0.03") + Decimal("0.072") + Decimal(
        "0.045"
    )
    assert u.cost_usd == Decimal("1.083")


async def test_gemini_usage_metadata_counts_thoughts_as_reasoning_output_and_cached_content_as_reads() -> (
    None
):
    usage = {
        "promptTokenCount": 5_000,
        "cachedContentTokenCount": 4_000,
        "candidatesTokenCount": 200,
        "thoughtsTokenCount": 800,
        "totalTokenCount": 6_000,
    }
    u = await priced("gemini/gemini-2.5-flash", reply(usage, key="usageMetadata"))
    assert (u.input_tokens, u.cache_read_input_tokens) == (5_000, 4_000)
    assert (u.output_tokens, u.reasoning_output_tokens) == (1_000, 800)
    # 1,000 x $0.30/M + 4,000 x $0.03/M + 200 x $2.50/M + 800 reasoning x $2.50/M
    assert u.cost_usd == Decimal("0.00292")


async def test_openai_cached_and_reasoning_tokens_are_split_out_before_pricing() -> None:
    usage = {
        "prompt_tokens": 12_000,
        "completion_tokens": 850,
        "prompt_tokens_details": {"cached_tokens": 9_000},
        "completion_tokens_details": {"reasoning_tokens": 300},
    }
    u = await priced("openai/gpt-4.1-2025-04-14", reply(usage))
    assert (u.cache_read_input_tokens, u.reasoning_output_tokens) == (9_000, 300)
    # 3,000 x $2/M + 9,000 x $0.50/M + 850 x $8/M (gpt-4.1 prices reasoning as output)
    assert u.cost_usd == Decimal("0.0173")


async def test_an_openrouter_name_resolves_to_the_model_and_its_own_charge_overrides_the_table() -> None:
    usage: dict[str, Any] = {"prompt_tokens": 1_000, "completion_tokens": 100}
    by_table = await priced("openrouter/deepseek/deepseek-v3.2", reply(usage))
    # 1,000 x $0.28/M + 100 x $0.42/M
    assert by_table.cost_usd == Decimal("0.000322")
    assert by_table.cost_source == ""
    charged = await priced("openrouter/deepseek/deepseek-v3.2", reply({**usage, "cost": 0.00042}))
    assert charged.cost_usd == Decimal("0.00042")
    assert charged.cost_source == "provider"
    assert charged.to_dict()["cost_source"] == "provider"


@pytest.mark.parametrize("cost", [1e300, "1e400", 1_000_000_001, "1e-50"])
async def test_a_provider_charge_no_call_can_have_is_not_taken_over_the_table(cost: Any) -> None:
    # A proxy's usage.cost of 1e300 (or "1e400") was taken as the call's charge: past what the
    # ledger stores ($10^9), the step failed as a reply that cannot be recorded, its cost recorded
    # as $10^9. Like a negative or non-finite charge, it is not read: the table prices the call.
    usage: dict[str, Any] = {"prompt_tokens": 1_000, "completion_tokens": 100}
    u = await priced("openrouter/deepseek/deepseek-v3.2", reply({**usage, "cost": cost}))
    assert u.cost_usd == Decimal("0.000322")
    assert u.cost_source == ""


@pytest.mark.parametrize("count", [10**30, 1e30, "1" + "0" * 30, 10**12 + 1])
async def test_a_token_count_no_call_can_have_cannot_be_read(count: Any) -> None:
    # A proxy's prompt_tokens of 10^30 was read as such and priced ($2 x 10^24 for gpt-4.1):
    # past what the ledger stores (10^12 tokens, $10^9), the step failed as a reply that cannot
    # be recorded, its cost recorded as $10^9. It cannot be read, as a negative count cannot.
    u = await priced("gpt-4.1", reply({"prompt_tokens": count, "completion_tokens": 100}))
    assert (u.input_tokens, u.output_tokens, u.unpriced) == (0, 100, True)
    assert u.extra["attempt_log"][0]["unreadable_usage"] == ["prompt_tokens"]


async def test_an_azure_deployment_is_priced_through_an_alias_in_the_price_file(tmp_path: Path) -> None:
    shipped = json.loads(resources.files("flowledger.adapters.llm").joinpath("prices.json").read_text())
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({**shipped, "aliases": {"azure/prod-gpt41-eu": "gpt-4.1"}}))
    u = await priced(
        "azure/prod-gpt41-eu", reply({"prompt_tokens": 1_000, "completion_tokens": 10}), prices_file=path
    )
    assert u.cost_usd == Decimal("0.00208")  # 1,000 x $2/M + 10 x $8/M
    assert not load_price_table().knows("azure/prod-gpt41-eu")


def test_an_alias_to_a_model_without_a_price_is_refused_when_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    entry = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    path.write_text(json.dumps({"version": "v", "models": {"a": entry}, "aliases": {"b": "nowhere"}}))
    with pytest.raises(ValidationError, match=r"aliases\.b"):
        load_price_table(path)


async def test_an_unpriced_model_is_refused_before_sending_by_default() -> None:
    sent: list[httpx.Request] = []
    llm = client(lambda request: sent.append(request) or httpx.Response(200, json=reply({})))
    with pytest.raises(UnknownModelPrice):
        await llm.complete(model="mystery-model-7", messages=MESSAGES)
    await llm.aclose()
    assert sent == []


async def test_an_unpriced_model_is_flagged_not_priced_at_zero_when_configured_to_call_it() -> None:
    body = reply({"prompt_tokens": 1_000, "completion_tokens": 10})
    u = await priced("mystery-model-7", body, unpriced_models="flag")
    assert u.unpriced is True
    assert u.to_dict()["unpriced"] is True
    assert u.extra["attempt_log"][0]["cost_usd"] is None


def test_a_dated_price_applies_from_its_effective_time_and_not_before() -> None:
    table = load_price_table()
    v31 = table.price_for("deepseek-chat", datetime(2025, 9, 29, 15, 59, tzinfo=UTC))
    v32 = table.price_for("deepseek/deepseek-chat", datetime(2025, 9, 29, 16, 0, tzinfo=UTC))
    assert (v31.input_cost_per_token, v32.input_cost_per_token) == (Decimal("5.6e-7"), Decimal("2.8e-7"))
    with pytest.raises(UnknownModelPrice):
        table.price_for("deepseek-chat", datetime(2025, 1, 1, tzinfo=UTC))


async def test_a_call_is_priced_at_the_price_in_force_when_it_is_made() -> None:
    body = reply({"prompt_tokens": 1_000_000, "completion_tokens": 0})
    before = await priced("deepseek-chat", body, now=lambda: datetime(2025, 9, 20, tzinfo=UTC))
    after = await priced("deepseek-chat", body, now=lambda: datetime(2025, 10, 20, tzinfo=UTC))
    assert (before.cost_usd, after.cost_usd) == (Decimal("0.56"), Decimal("0.28"))


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


async def test_every_billed_attempt_is_in_the_usage_and_retried_attempts_are_priced_apart() -> None:
    # Given a stream cut after its usage chunk but before its finish reason (billed, retried;
    # one with both and no [DONE] is whole: see
    # test_a_stream_ended_without_done_is_whole_only_after_its_finish_and_usage), a 503, then an answer
    billed = {"prompt_tokens": 1_000, "completion_tokens": 100}
    delta = {
        "id": "r",
        "model": "gpt-4.1",
        "choices": [{"delta": {"content": "{}"}, "finish_reason": "stop"}],
    }
    unfinished = {
        "id": "r",
        "model": "gpt-4.1",
        "choices": [{"delta": {"content": "{"}, "finish_reason": None}],
    }
    replies = iter(
        [
            httpx.Response(200, content=_sse(unfinished, {"choices": [], "usage": billed}, done=False)),
            httpx.Response(503, json={"error": {"message": "busy"}}),
            httpx.Response(200, content=_sse(delta, {"choices": [], "usage": billed})),
        ]
    )
    async with client(lambda request: next(replies), stream=True) as llm:
        u = (await llm.complete(model="gpt-4.1", messages=MESSAGES)).usage
    # Then the answer is the usage, and the cut attempt is billed beside it
    log = u.extra["attempt_log"]
    assert [entry["outcome"] for entry in log] == ["connection_error", "http_503", "ok"]
    assert [("usage" in entry) for entry in log] == [True, False, True]
    assert u.cost_usd == Decimal("0.0028")  # 1,000 x $2/M + 100 x $8/M
    assert u.retried_cost_usd == Decimal("0.0028")
    assert u.charged_usd == Decimal("0.0056")
    assert Decimal(log[0]["cost_usd"]) == Decimal("0.0028")


BILLED = {"prompt_tokens": 1_000, "completion_tokens": 100}


@pytest.mark.parametrize(
    ("stream", "text"),
    [
        (False, json.dumps({"id": "r", "usage": BILLED})),
        # (The stream's usage, read before the chunk that broke it, was dropped: a silent $0.)
        (True, f"data: {json.dumps({'id': 'r', 'choices': [], 'usage': BILLED})}\n\ndata: {{not json\n\n"),
    ],
    ids=["a body without choices", "a stream broken after its usage chunk"],
)
async def test_a_failed_call_keeps_what_its_unreadable_reply_was_billed(stream: bool, text: str) -> None:
    llm = client(lambda request: httpx.Response(200, text=text), stream=stream)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    usage = raised.value.usage
    assert usage is not None
    assert raised.value.error_type == "malformed_response"
    assert (usage.input_tokens, usage.cost_usd, usage.unpriced) == (1_000, Decimal("0.0028"), False)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}, (10, 10, 0)),
        ({"input_tokens": 5, "cache_creation": {"ephemeral_1h_input_tokens": 7}}, (12, 0, 7)),
        ({"prompt_tokens": 10, "cache_creation_input_tokens": 50}, (10, 0, 10)),
        ("not usage", (0, 0, 0)),
    ],
)
def test_impossible_sub_counts_are_clamped_never_trusted(usage: Any, expected: tuple[int, int, int]) -> None:
    parsed = parse_usage(usage)
    assert (
        parsed.input_tokens,
        parsed.cache_read_input_tokens,
        parsed.cache_creation_input_tokens,
    ) == expected


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("openrouter/deepseek/deepseek-v3.2", "deepseek-v3.2"),
        ("deepseek-v3.2:nitro", "deepseek-v3.2"),
        ("deepseek-v3.2:free", "deepseek-v3.2:free"),  # priced $0: tests/unit/test_free_variants.py
        ("vertex_ai/claude-sonnet-4-5@20250929", "claude-sonnet-4.5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4.5"),
        ("openai/gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gemini/gemini-2.5-flash", "gemini-2.5-flash"),
        ("gpt-4.1-mini", None),
    ],
)
def test_prefixed_suffixed_dated_and_aliased_names_resolve_to_one_price(name: str, key: str | None) -> None:
    assert load_price_table().resolve(name) == key


def test_the_latest_prices_hold_each_dated_models_newest_entry() -> None:
    assert load_price_table().latest()["deepseek-chat"].input_cost_per_token == Decimal("2.8e-7")


async def test_counts_sent_as_whole_floats_or_digit_strings_are_priced_as_integers() -> None:
    u = await priced("gpt-4.1", reply({"prompt_tokens": 1000.0, "completion_tokens": "100"}))
    assert (u.input_tokens, u.output_tokens) == (1000, 100)
    assert (u.cost_usd, u.unpriced) == (Decimal("0.0028"), False)  # 1,000 x $2/M + 100 x $8/M


@pytest.mark.parametrize("count", [-1000, 1000.5, "1,000", True])
async def test_a_reply_whose_counts_cannot_be_read_is_unpriced_not_a_silent_zero(count: Any) -> None:
    # Given an answer whose prompt tokens cannot be read
    u = await priced("gpt-4.1", reply({"prompt_tokens": count, "completion_tokens": 100}))
    # Then what it cost is not known (not the cost of 0 prompt tokens), and its log says why
    assert u.unpriced is True
    [answer] = u.extra["attempt_log"]
    assert (answer["cost_usd"], answer["unreadable_usage"]) == (None, ["prompt_tokens"])
    assert u.output_tokens == 100  # what could be read is kept
    # And no repricing prices the zero that stands for the count it could not read
    assert u.billed_unreported is True
    assert call_cost(u, REPRICED_AT, [REPRICING]).unpriced is True


@pytest.mark.parametrize(
    ("usage", "missing"),
    [
        ({"prompt_tokens": 1000}, ["completion_tokens"]),
        ({"prompt_tokens": 1000, "completion_tokens": None}, ["completion_tokens"]),
        ({"prompt_tokens": None, "completion_tokens": 100}, ["prompt_tokens"]),
        ({"input_tokens": 1000}, ["output_tokens"]),
        ({"input_tokens": 1000, "output_tokens": 10, "input_tokens_details": {}}, []),
    ],
    ids=["chat without completion", "chat null completion", "chat null prompt", "anthropic", "responses"],
)
async def test_a_reply_that_leaves_out_a_count_its_shape_always_has_is_unpriced(
    usage: dict[str, Any], missing: list[str]
) -> None:
    # Given an answer whose usage leaves out (or nulls) a count every reply of its shape carries
    u = await priced("gpt-4.1", reply(usage))
    # Then what it cost is not known, and the log names the count: priced as 0 output tokens,
    # a proxy that dropped completion_tokens paid only for the prompt ($0.002), past any budget
    [answer] = u.extra["attempt_log"]
    if missing:
        assert (u.unpriced, u.billed_unreported) == (True, True)
        assert (answer["cost_usd"], answer["unreadable_usage"]) == (None, missing)
    else:
        assert (u.unpriced, answer["cost_usd"]) == (False, "0.0020800")


async def test_a_providers_own_charge_prices_a_reply_whose_counts_cannot_be_read() -> None:
    u = await priced(
        "openrouter/openai/gpt-4.1", reply({"prompt_tokens": "?", "completion_tokens": 1, "cost": 0.5})
    )
    assert (u.cost_usd, u.cost_source, u.unpriced) == (Decimal("0.5"), "provider", False)


# A repricing that prices the model that had no price, and gpt-4.1 anew.
REPRICED_AT = datetime(2026, 12, 1, tzinfo=UTC)
REPRICING = Repricing(
    datetime(2026, 1, 1, tzinfo=UTC),
    PriceTable(
        version="repriced",
        prices={
            name: ModelPrice(input_cost_per_token=Decimal("1e-6"), output_cost_per_token=Decimal("2e-6"))
            for name in ("mystery-model-7", "gpt-4.1")
        },
    ),
    "repriced.json",
)
CUT = f"data: {json.dumps({'id': 'r', 'choices': [{'delta': {'content': '{'}}]})}\n\n"
"""A stream the provider began answering, cut before its usage chunk."""


async def test_a_repricing_prices_the_reported_tokens_of_a_model_that_had_no_price() -> None:
    u = await priced("mystery-model-7", reply(BILLED), unpriced_models="flag")
    repriced = call_cost(u, REPRICED_AT, [REPRICING])
    # 1,000 x $1/M + 100 x $2/M
    assert (repriced.unpriced, repriced.cost_usd, repriced.price_version) == (
        False,
        Decimal("0.0012"),
        "repriced",
    )


async def _unreported(how: str, model: str) -> LlmUsage:
    """The usage of a call on ``model`` billed for tokens its provider did not report."""
    if how == "an answer without usage":
        body = {"id": "r-1", "model": model, "choices": [{"message": {"content": "{}"}}]}
        return await priced(model, body, unpriced_models="flag")
    retried = how == "an answer after a stream cut before its usage chunk"
    replies = iter([httpx.Response(200, text=CUT), httpx.Response(200, content=_sse(*STREAMED))])
    options: dict[str, Any] = {"stream": True, "unpriced_models": "flag", "max_retries": int(retried)}
    async with client(lambda request: next(replies), **options) as llm:
        if retried:
            return (await llm.complete(model=model, messages=MESSAGES)).usage
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model=model, messages=MESSAGES)
    assert raised.value.usage is not None
    return raised.value.usage


STREAMED = (
    {"id": "r", "model": "m", "choices": [{"delta": {"content": "{}"}, "finish_reason": "stop"}]},
    {"choices": [], "usage": BILLED},
)
"""A whole stream: its content, and its usage chunk."""


@pytest.mark.parametrize("model", ["mystery-model-7", "gpt-4.1"], ids=["no price when called", "priced"])
@pytest.mark.parametrize(
    "how",
    [
        "an answer without usage",
        "a stream cut before its usage chunk",
        "an answer after a stream cut before its usage chunk",
    ],
)
async def test_a_repricing_never_prices_what_the_provider_did_not_report(how: str, model: str) -> None:
    # Given a call billed for tokens its provider did not report: its cost is not known
    u = await _unreported(how, model)
    assert u.unpriced is True
    # When a price table that prices its model reprices it (the projection, and the dry run)
    repriced = call_cost(u, REPRICED_AT, [REPRICING])
    [change] = changes(iter([(model, REPRICED_AT, u)]), [], REPRICING)
    # Then its cost stays unknown: never a $0 made of the zeros that stand for what was not said
    assert repriced.unpriced is True
    assert (change.unpriced_before, change.unpriced_after) == (1, 1)


@pytest.mark.parametrize(
    "stored",
    [
        {"unpriced": True, "extra": {"usage_reported": False, "attempt_log": [{"n": 1, "outcome": "ok"}]}},
        {
            "input_tokens": 1_000,
            "output_tokens": 100,
            "unpriced": True,
            "extra": {
                "estimated_prompt_tokens": 5,
                "attempt_log": [
                    {"n": 1, "outcome": "connection_error", "usage_reported": False, "cost_usd": None},
                    {"n": 2, "outcome": "ok", "usage": {"input_tokens": 1_000, "output_tokens": 100}},
                ],
            },
        },
    ],
    ids=["its answer's usage", "a retried attempt's usage"],
)
def test_a_usage_stored_before_billed_unreported_was_recorded_is_still_not_repriced(
    stored: dict[str, Any],
) -> None:
    # Given a usage as the release before stored it: what was not reported, only in extra
    u = LlmUsage.from_dict({"provider": "openai", "request_model": "gpt-4.1", **stored})
    # Then a repricing leaves its cost unknown (it reads the extra the adapter wrote)
    assert call_cost(u, REPRICED_AT, [REPRICING]).unpriced is True
    assert u.billed_unreported is False  # the field's default: the stored usage did not say


def test_billed_unreported_is_kept_only_when_set_and_needs_unpriced() -> None:
    u = LlmUsage(request_model="gpt-4.1", unpriced=True, billed_unreported=True)
    assert LlmUsage.from_dict(u.to_dict()) == u
    assert "billed_unreported" not in LlmUsage(request_model="gpt-4.1").to_dict()
    with pytest.raises(ValidationError) as raised:
        LlmUsage(request_model="gpt-4.1", billed_unreported=True)
    assert raised.value.field == "usage.billed_unreported"


async def test_an_engine_prices_its_calls_by_its_own_clock_not_the_hosts() -> None:
    # Given a client whose host clock reads after deepseek-chat's price fell (2025-09-29 16:00
    # UTC), handed to an engine whose clock (one for every engine on the database) reads before
    body = reply({"prompt_tokens": 1_000_000, "completion_tokens": 0})
    host_after = client(
        lambda request: httpx.Response(200, json=body), now=lambda: datetime(2025, 10, 20, tzinfo=UTC)
    )
    engine = Engine.in_memory(
        settings=Settings(home=Path("/nonexistent")),
        llm=host_after,
        clock=lambda: datetime(2025, 9, 20, tzinfo=UTC),
    )
    try:
        engine.start_session("s-1", "support")
        # When a step calls the model
        step = await engine.process_step("s-1", "answer", {"message": "hi"}, model="deepseek-chat")
        # Then the call is priced at the price in force by the engine's clock: a host minutes
        # off priced a call near a price change by the other version
        assert step.usage is not None
        assert step.usage.cost_usd == Decimal("0.56")
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("asked", "answered", "billed"),
    [
        ("gpt-4.1", "anthropic/claude-sonnet-4.5", "claude-sonnet-4.5"),  # a router's or a fallback's bill
        ("gpt-4.1", "gpt-4.1-2025-04-14", "gpt-4.1"),  # a dated name of the model asked for
        ("gpt-4.1", "someone-elses-model", "gpt-4.1"),  # a model the table does not know
        ("openrouter/auto", "deepseek/deepseek-v3.2", "deepseek-v3.2"),  # asked for no priced model
        ("gpt-4.1", "", "gpt-4.1"),
        ("mystery", "", None),
    ],
)
def test_a_call_is_billed_as_the_model_that_answered_when_the_table_knows_it_as_another(
    asked: str, answered: str, billed: str | None
) -> None:
    # One rule for the adapter, reprice and the dashboard's what-if (billed_key)
    assert load_price_table().billed_model(asked, answered) == billed
    assert billed_key({"a": "a", "b": "b"}.get, "a", "b") == "b"


def test_a_repricing_prices_a_call_as_the_model_that_answered() -> None:
    # Given a call asked of gpt-4.1 and answered by another model, both priced by a repricing
    usage = LlmUsage(request_model="gpt-4.1", response_model="claude-x", input_tokens=1000, output_tokens=100)
    repricing = Repricing(
        datetime(2026, 1, 1, tzinfo=UTC),
        PriceTable(
            version="two-models",
            prices={
                "gpt-4.1": ModelPrice(
                    input_cost_per_token=Decimal("1e-6"), output_cost_per_token=Decimal("2e-6")
                ),
                "claude-x": ModelPrice(
                    input_cost_per_token=Decimal("3e-6"), output_cost_per_token=Decimal("15e-6")
                ),
            },
        ),
        "two-models.json",
    )
    # Then it is repriced as the adapter prices it: 1,000 x $3/M + 100 x $15/M
    assert call_cost(usage, REPRICED_AT, [repricing]).cost_usd == Decimal("0.0045")
