"""Prices per token type, the shipped table, LiteLLM files and the unknown-model rule."""

from __future__ import annotations

import json
from decimal import Decimal, localcontext
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.llm import ModelPrice, OpenAICompatibleClient, load_price_table
from flowledger.domain.errors import UnknownModelPrice, ValidationError
from flowledger.domain.price_table import MAX_PRICE_VERSION
from flowledger.domain.values import LlmUsage, require_usage
from flowledger.infrastructure import Settings

PER_MILLION = Decimal(1_000_000)


def test_a_call_priced_by_hand() -> None:
    # Given gpt-4.1 at $2/M input, $0.50/M cached input, $8/M output,
    # a call of 12,000 input tokens (9,000 of them cached) and 850 output tokens
    price = load_price_table().price_for("gpt-4.1")
    # When it is priced
    cost = price.cost(input_tokens=12_000, output_tokens=850, cache_read_input_tokens=9_000)
    # Then: 3,000 x 0.000002 = 0.006; 9,000 x 0.0000005 = 0.0045; 850 x 0.000008 = 0.0068
    assert cost == Decimal("0.0173")


def test_reasoning_tokens_are_priced_at_their_own_rate_when_one_is_given() -> None:
    price = ModelPrice(
        input_cost_per_token=Decimal("1e-6"),
        output_cost_per_token=Decimal("4e-6"),
        output_cost_per_reasoning_token=Decimal("3e-6"),
    )
    # 100 x 1e-6 + 200 visible x 4e-6 + 300 reasoning x 3e-6
    cost = price.cost(input_tokens=100, output_tokens=500, reasoning_output_tokens=300)
    assert cost == Decimal("0.0018")
    without_rate = ModelPrice(input_cost_per_token=Decimal("1e-6"), output_cost_per_token=Decimal("4e-6"))
    assert without_rate.cost(input_tokens=100, output_tokens=500, reasoning_output_tokens=300) == Decimal(
        "0.0021"
    )


def test_cached_input_without_its_own_price_costs_the_input_price() -> None:
    price = ModelPrice(input_cost_per_token=Decimal("2e-6"), output_cost_per_token=Decimal("8e-6"))
    assert price.cost(input_tokens=1000, output_tokens=0, cache_read_input_tokens=600) == Decimal("0.002")


def test_the_shipped_table_has_the_seed_models_at_their_seed_output_prices() -> None:
    table = load_price_table()
    seed_per_million = {
        "deepseek-v3.2": "0.42",
        "gpt-4.1": "8",
        "claude-sonnet-4.5": "15",
        "gemini-2.5-flash": "2.50",
    }
    for model, dollars in seed_per_million.items():
        price = table.price_for(model)
        assert price.output_cost_per_token * PER_MILLION == Decimal(dollars)
        assert price.cache_read_input_token_cost is not None
        assert price.cache_read_input_token_cost < price.input_cost_per_token < price.output_cost_per_token
    assert table.version.startswith("flowledger-")


def test_costs_are_exact_decimals_not_floats() -> None:
    price = load_price_table().price_for("deepseek-v3.2")
    cost = price.cost(input_tokens=3, output_tokens=3)
    assert isinstance(cost, Decimal)
    assert cost == Decimal("0.00000210")


def test_an_unknown_model_is_an_error_unless_a_default_price_is_configured() -> None:
    with pytest.raises(UnknownModelPrice) as raised:
        load_price_table().price_for("llama-9000")
    assert raised.value.model == "llama-9000"
    fallback = ModelPrice(input_cost_per_token=Decimal("1e-6"), output_cost_per_token=Decimal("2e-6"))
    table = load_price_table(default=fallback)
    assert table.price_for("llama-9000") is fallback
    assert table.price_for("gpt-4.1") is not fallback


def test_a_provider_prefix_finds_the_bare_model() -> None:
    table = load_price_table()
    assert table.price_for("openai/gpt-4.1") == table.price_for("gpt-4.1")


def litellm_file(tmp_path: Path) -> Path:
    data = {
        "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "mode": "one of chat"},
        "gpt-4.1": {
            "input_cost_per_token": 2e-06,
            "output_cost_per_token": 8e-06,
            "cache_read_input_token_cost": 5e-07,
            "litellm_provider": "openai",
            "mode": "chat",
        },
        "dall-e-3": {"output_cost_per_image": 0.04, "mode": "image_generation"},
    }
    path = tmp_path / "model_prices_and_context_window.json"
    path.write_text(json.dumps(data))
    return path


def test_a_litellm_price_file_loads_with_a_content_version(tmp_path: Path) -> None:
    path = litellm_file(tmp_path)
    table = load_price_table(path)
    assert set(table.prices) == {"gpt-4.1"}
    assert table.version.startswith("model_prices_and_context_window.json@sha256:")
    cost = table.price_for("gpt-4.1").cost(input_tokens=1000, output_tokens=100, cache_read_input_tokens=500)
    assert cost == Decimal("0.00205")


async def test_flowledger_pricing_file_overrides_the_shipped_table(tmp_path: Path) -> None:
    path = litellm_file(tmp_path)
    settings = Settings.from_env(
        {
            "FLOWLEDGER_PRICING_FILE": str(path),
            "FLOWLEDGER_LLM_BASE_URL": "http://127.0.0.1:9/v1",
            "FLOWLEDGER_LLM_API_KEY": "sk-test-secret-1",
        }
    )
    llm = OpenAICompatibleClient.from_settings(settings, transport=httpx.MockTransport(lambda r: None))
    assert llm.prices.version == load_price_table(path).version
    assert not llm.prices.knows("deepseek-v3.2")
    await llm.aclose()


def test_our_own_format_needs_a_version_and_may_carry_a_default(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"models": {"m": {"input_cost_per_token": 1, "output_cost_per_token": 2}}}))
    with pytest.raises(ValidationError, match="version"):
        load_price_table(path)
    path.write_text(
        json.dumps(
            {
                "version": "v7",
                "models": {"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}},
                "default": {"input_cost_per_token": 5e-6, "output_cost_per_token": 5e-6},
            }
        )
    )
    table = load_price_table(path)
    assert table.version == "v7"
    assert table.estimate("anything", input_tokens=1, output_tokens=1) == Decimal("0.000010")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", r"pricing_file: prices\.json is not JSON"),
        ("[1, 2]", r"pricing_file: prices\.json must hold a JSON object"),
        (
            '{"version": "v", "models": {"m": {"input_cost_per_token": -1, "output_cost_per_token": 1}}}',
            r"pricing_file: prices\.json, model 'm': input_cost_per_token must be >= 0, got -1$",
        ),
        # JSON's NaN raised decimal.InvalidOperation out of the loader; Infinity (and a string
        # "inf") was taken, and every call to the model then raised InvalidOperation.
        (
            '{"version": "v", "models": {"m": {"input_cost_per_token": NaN, "output_cost_per_token": 1}}}',
            r"pricing_file: prices\.json, model 'm': input_cost_per_token must be a finite number, got NaN$",
        ),
        (
            '{"version": "v", "models": {"m": {"input_cost_per_token": 1,'
            ' "output_cost_per_token": Infinity}}}',
            r"model 'm': output_cost_per_token must be a finite number, got Infinity$",
        ),
        (
            '{"version": "v", "models": {"m": {"input_cost_per_token": 1, "output_cost_per_token": 1,'
            ' "cache_read_input_token_cost": "-inf"}}}',
            r"model 'm': cache_read_input_token_cost must be a finite number, got -Infinity$",
        ),
        # 41 decimal places: taken, every call the model answered was made, paid, then refused
        # as "the model's reply cannot be recorded: usage.cost_usd: ... at most 40 decimal places"
        (
            '{"version": "v", "models": {"m": {"output_cost_per_token": 1,'
            ' "input_cost_per_token": "0.00000012345678901234567890123456789012345"}}}',
            r"model 'm': input_cost_per_token must have at most 40 decimal places \(as a recorded cost\),"
            r" got 1\.2345678901234567890123456789012345E-7$",
        ),
        # Model names no command takes were taken and shown as such (an outside probe): empty,
        # blank, a NUL, an escape; in aliases too; and in a LiteLLM file's priced entries.
        (
            '{"version": "v", "models": {"": {"input_cost_per_token": 1, "output_cost_per_token": 1}}}',
            r"prices\.json, model '': model must be a non-empty string$",
        ),
        (
            '{"version": "v", "models": {"  ": {"input_cost_per_token": 1, "output_cost_per_token": 1}}}',
            r"prices\.json, model '  ': model must be a non-empty string$",
        ),
        (
            '{"version": "v", "models": {"a\\u0000b":'
            ' {"input_cost_per_token": 1, "output_cost_per_token": 1}}}',
            r"prices\.json, model 'a\\x00b': model must not contain NUL characters",
        ),
        (
            '{"version": "v", "models": {"a\\u001bb":'
            ' {"input_cost_per_token": 1, "output_cost_per_token": 1}}}',
            r"prices\.json, model 'a\\x1bb': model must not contain control characters \(found U\+001B\)$",
        ),
        (
            '{"version": "v", "models": {"m": {"input_cost_per_token": 1, "output_cost_per_token": 1}},'
            ' "aliases": {"a\\u001b": "m"}}',
            r"prices\.json: aliases: alias must not contain control characters",
        ),
        (
            '{"a\\u0007": {"input_cost_per_token": 1, "output_cost_per_token": 1}}',
            r"prices\.json, model 'a\\x07': model must not contain control characters",
        ),
        # A version every priced call cites: one of 5,000 characters was taken, and every call
        # then paid for failed as "the model's reply cannot be recorded: usage.price_version"
        (
            '{"version": "' + "v" * 1001 + '", "models": {"m": {"input_cost_per_token": 1,'
            ' "output_cost_per_token": 1}}}',
            r"prices\.json: version: must be at most 1000 characters, got 1001$",
        ),
        (
            '{"version": "v\\n1", "models": {"m": {"input_cost_per_token": 1, "output_cost_per_token": 1}}}',
            r"prices\.json: version: must not contain control characters \(found U\+000A\)$",
        ),
        # Amounts in another currency or unit were charged as USD per token without a word: a
        # per-million file's $2 input was $2 a token.
        (
            '{"version": "v", "currency": "EUR", "models": {"m": {"input_cost_per_token": 1e-6,'
            ' "output_cost_per_token": 2e-6}}}',
            r"prices\.json: currency 'EUR' is not read: prices are USD per token \(currency 'USD'\)$",
        ),
        (
            '{"version": "v", "unit": "per million tokens", "models": {"m": {"input_cost_per_token": 2,'
            ' "output_cost_per_token": 8}}}',
            r"prices\.json: unit 'per million tokens' is not read: prices are USD per token"
            r" \(unit 'per token'\)$",
        ),
        (
            '{"version": "v", "currency": null, "models": {"m": {"input_cost_per_token": 1e-6,'
            ' "output_cost_per_token": 2e-6}}}',
            r"prices\.json: currency 'None' is not read",
        ),
    ],
)
def test_a_broken_price_file_is_rejected(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ValidationError, match=message):
        load_price_table(path)
    with pytest.raises(ValidationError, match=r"pricing_file: cannot read .*missing\.json"):
        load_price_table(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        # Said "price.input_cost_per_token: must be a Decimal >= 0, got Decimal('-0.000001')",
        # "price: needs input_cost_per_token and output_cost_per_token", ...: no file, no model.
        (
            {"input_cost_per_token": -1e-6, "output_cost_per_token": 1e-6},
            "input_cost_per_token must be >= 0, got -0.000001",
        ),
        (
            {"input_cost_per_token": 1e-6, "output_cost_per_token": None},
            "needs input_cost_per_token and output_cost_per_token",
        ),
        # An entry of our own format without an output price was left out without a word: a
        # call to the model was then refused as having no price.
        ({"input_cost_per_token": 1e-6}, "needs input_cost_per_token and output_cost_per_token"),
        ({"output_cost_per_token": 1e-6}, "needs input_cost_per_token and output_cost_per_token"),
        (
            {"input_cost_per_token": "abc", "output_cost_per_token": 1e-6},
            "input_cost_per_token must be a number, got 'abc'",
        ),
        (
            {
                "input_cost_per_token": 1e-6,
                "output_cost_per_token": 1e-6,
                "cache_read_input_token_cost": True,
            },
            "cache_read_input_token_cost must be a number, got True",
        ),
        (
            [{"effective_from": "2025-01-01T00:00:00Z", "input_cost_per_token": 1e-6}],
            "each dated entry needs effective_from, input and output prices",
        ),
        # Taken: prices show stopped on decimal.Overflow (exit 70), and every call of the model
        # cost more than a cost may be recorded as, after it was made and paid.
        (
            {"input_cost_per_token": "1e999999", "output_cost_per_token": 1e-6},
            "input_cost_per_token must be at most 1000000000 (a call's most), got 1E+999999",
        ),
        # Taken: prices show stopped on OverflowError (exit 70) reading it in UTC.
        (
            [
                {
                    "effective_from": "0001-01-01T00:00:00+01:00",
                    "input_cost_per_token": 1e-6,
                    "output_cost_per_token": 1e-6,
                }
            ],
            "effective_from must lie within the years 1 to 9999 in UTC, got 0001-01-01T00:00:00+01:00",
        ),
        # Said "prices.acme/bad-1: needs entries in effective_from order, no two alike": no file.
        (
            [
                {
                    "effective_from": "2026-01-01T00:00:00Z",
                    "input_cost_per_token": 1e-6,
                    "output_cost_per_token": 1e-6,
                },
                {
                    "effective_from": "2026-01-01T01:00:00+01:00",
                    "input_cost_per_token": 2e-6,
                    "output_cost_per_token": 1e-6,
                },
            ],
            "needs dated entries, no two in force from the same time",
        ),
    ],
)
def test_a_price_that_cannot_be_used_names_its_file_and_model(
    tmp_path: Path, entry: object, message: str
) -> None:
    # Given a file whose one bad entry sits among good ones
    path = tmp_path / "team-prices.json"
    good = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    path.write_text(json.dumps({"version": "v1", "models": {"good": good, "acme/bad-1": entry}}))
    # When / Then
    with pytest.raises(ValidationError) as raised:
        load_price_table(path)
    assert raised.value.field == "pricing_file"
    assert str(raised.value) == f"pricing_file: team-prices.json, model 'acme/bad-1': {message}"


def test_a_litellm_file_still_leaves_out_entries_that_price_no_chat(tmp_path: Path) -> None:
    # LiteLLM's own file lists embedding and image models without an output price.
    path = tmp_path / "model_prices_and_context_window.json"
    chat = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    embedding = {"mode": "embedding", "input_cost_per_token": 1e-7}
    path.write_text(json.dumps({"chat-1": chat, "embed-1": embedding}))
    table = load_price_table(path)
    assert table.knows("chat-1")
    assert not table.knows("embed-1")


def test_a_calls_most_is_its_prompt_at_the_dearest_input_type_and_its_cap_at_the_dearest_output() -> None:
    # Given claude-sonnet-4.5: $3/M input, $3.75/M 5-minute cache writes, $6/M 1-hour writes
    price = load_price_table().price_for("claude-sonnet-4.5")
    # When the most a 10,000-token prompt with a 16-token cap can cost is asked
    most = price.most(input_tokens=10_000, output_tokens=16)
    # Then it is the prompt written to the 1-hour cache: 10,000 x 6e-6 + 16 x 15e-6,
    # what the provider bills when the request asks for that cache
    assert most == Decimal("0.06024")
    assert most == price.cost(
        input_tokens=10_000,
        output_tokens=16,
        cache_creation_input_tokens=10_000,
        cache_creation_1h_input_tokens=10_000,
    )
    # And a dearer reasoning rate prices the whole cap
    thinking = ModelPrice(
        input_cost_per_token=Decimal("1e-6"),
        output_cost_per_token=Decimal("4e-6"),
        output_cost_per_reasoning_token=Decimal("5e-6"),
    )
    assert thinking.most(input_tokens=100, output_tokens=10) == Decimal("0.00015")


def test_a_calls_estimate_holds_what_a_prompt_written_to_the_cache_costs() -> None:
    # Given a client of the shipped table and a 40,000-character prompt for claude-sonnet-4.5
    client = OpenAICompatibleClient.from_settings(
        Settings(llm_base_url="https://llm.test/v1", llm_api_key="sk-test-key"), max_tokens=16
    )
    messages = [{"role": "user", "content": "x" * 40_000}]
    # When its most is estimated
    estimate = client.max_cost("claude-sonnet-4.5", messages)
    # Then it holds the prompt at the 1-hour cache-write rate: at the input rate it held
    # $0.030252 for a call the provider bills $0.060264 when it writes the prompt to that cache
    price = client.prices.price_for("claude-sonnet-4.5")
    prompt = estimate.prompt_tokens
    billed = price.cost(
        input_tokens=prompt,
        output_tokens=16,
        cache_creation_input_tokens=prompt,
        cache_creation_1h_input_tokens=prompt,
    )
    assert estimate.max_cost_usd == billed == Decimal("0.060264")


def test_a_cost_is_exact_past_28_digits_and_whatever_decimal_context_the_thread_has() -> None:
    # Given a price written with 17 significant digits
    price = ModelPrice(
        input_cost_per_token=Decimal("1.2345678901234567e-06"),
        output_cost_per_token=Decimal("4.9382715604938268e-06"),
    )
    # When 987,654,321,987 input tokens are priced: 29 significant digits
    huge = price.cost(input_tokens=987_654_321_987, output_tokens=123_456_789)
    # Then none is rounded away (the default context's 28 digits dropped the last one)
    assert huge == Decimal("1219935.9756168723278743026081")
    # And a service that embeds the engine and sets its own precision changes no cost
    with localcontext() as embedder:
        embedder.prec = 6
        cost = price.cost(input_tokens=1_234_567, output_tokens=89)
        usage = LlmUsage(cost_usd=cost, retried_cost_usd=Decimal("0.0000001"))
        charged = usage.charged_usd
    assert cost == Decimal("1.5245962825749295183341")  # was 1.52460
    assert charged == Decimal("1.5245963825749295183341")


def test_a_sessions_total_cost_is_not_rounded_by_an_embedding_services_decimal_context() -> None:
    """A session's ``totals.cost_usd`` sums its calls' costs: under an embedding service's
    ``getcontext().prec = 6`` two calls of $1.5245962825749295 totalled $3.04920, though README
    says costs and their sums are never rounded (the sum was taken in the thread's context)."""
    from flowledger.infrastructure import Engine

    # Given a session with two recorded calls of a 17-digit cost
    with Engine.in_memory() as engine:
        engine.start_session("s-1", "wf")
        for n in range(2):
            usage = LlmUsage(
                request_model="gpt-4.1",
                input_tokens=10,
                output_tokens=1,
                cost_usd=Decimal("1.5245962825749295"),
                retried_cost_usd=Decimal("0.0000000000000001"),
            )
            engine.record_step("s-1", f"step-{n}", usage=usage)
        # When a service that set its own precision reads the session
        with localcontext() as embedder:
            embedder.prec = 6
            total = engine.get_session("s-1").totals.cost_usd
    # Then its total is the exact sum of what each call was charged
    assert total == Decimal("3.0491925651498592")


def test_an_alias_naming_no_price_names_its_file(tmp_path: Path) -> None:
    """Said "aliases.x: names 'nope', which has no price", without the file, as every other
    fault of a price file names it."""
    path = tmp_path / "team-prices.json"
    good = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    path.write_text(json.dumps({"version": "v1", "models": {"good": good}, "aliases": {"x": "nope"}}))
    with pytest.raises(ValidationError) as raised:
        load_price_table(path)
    assert str(raised.value) == "pricing_file: team-prices.json: aliases.x: names 'nope', which has no price"


def test_the_longest_version_a_price_table_takes_is_one_a_recorded_usage_holds() -> None:
    # Given a usage citing a version as long as a price table's may be
    usage = LlmUsage(request_model="m", input_tokens=1, price_version="v" * MAX_PRICE_VERSION)
    # Then a recorded step takes it (a longer version made every priced call unrecordable)
    assert require_usage("usage", usage) is usage
