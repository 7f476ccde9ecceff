"""ClientConfig refuses at construction what would fail every call later (``adapters/llm/config.py``):
an endpoint URL that cannot be requested as given, and timeouts that are not finite."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    ModelLimits,
    OpenAICompatibleClient,
    build_engine,
    load_price_table,
)
from flowledger.adapters.llm.config import MAX_COMPLETION_TOKENS
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings

KEY = ApiKey("sk-config-1234")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        # Each was accepted, and then every call failed: a bare ValueError (port, credentials,
        # recorded as a failed step) or a 404 from a URL with the path after the query.
        ("http://127.0.0.1:99999/v1", "port"),
        ("http://[::1/v1", "not a URL"),
        ("http://user:secret@llm.test/v1", "credentials"),
        ("http://llm.test/v1?api-version=2024-06-01", "query"),
        ("http://llm.test/v1#part", "fragment"),
        # The client adds /chat/completions: every step was a 422 'HTTP 404 ... no route POST
        # /v1/chat/completions/chat/completions', as if each request were wrong.
        ("http://llm.test/v1/chat/completions", "give 'http://llm.test/v1'"),
        ("https://llm.test/openai/v1/chat/completions/", "give 'https://llm.test/openai/v1'"),
    ],
)
def test_an_endpoint_url_that_cannot_be_requested_as_given_is_refused_at_start_up(
    url: str, says: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url=url, api_key=KEY)
    assert raised.value.field == "llm_base_url"
    assert says in str(raised.value)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8089/v1", "https://api.openai.com/v1/", "http://[::1]:80/v1"]
)
def test_an_endpoint_url_with_a_host_port_and_path_is_taken(url: str) -> None:
    assert ClientConfig(base_url=url, api_key=KEY).endpoint.endswith("/v1/chat/completions")


@pytest.mark.parametrize(
    "field", ["request_timeout_s", "read_timeout_s", "connect_timeout_s", "breaker_recovery_s"]
)
@pytest.mark.parametrize("value", [math.inf, math.nan, 1e300, 86_400.5])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(field: str, value: float) -> None:
    # request_timeout_s=inf was taken, and every call failed with OverflowError
    # ("cannot convert float infinity to integer"), recorded as a failed step; 1e300 was taken
    # too, and an open breaker then asked callers to come back in 1e300 s (Retry-After).
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url="http://llm.test/v1", api_key=KEY, **{field: value})
    assert raised.value.field == field


def test_a_bad_timeout_in_the_environment_stops_the_engine_being_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given
    monkeypatch.setenv("FLOWLEDGER_LLM_REQUEST_TIMEOUT_S", "inf")
    settings = Settings(
        database_url="memory:",
        home=Path("/nonexistent"),
        llm_base_url="http://llm.test/v1",
        llm_api_key="sk-e-1234",
    )
    # When / Then
    with pytest.raises(ValidationError) as raised:
        build_engine(settings=settings)
    assert raised.value.field == "request_timeout_s"


def test_a_day_is_the_longest_timeout_and_breaker_recovery() -> None:
    day = 86_400.0
    config = ClientConfig(
        base_url="http://llm.test/v1",
        api_key=KEY,
        connect_timeout_s=day,
        request_timeout_s=day,
        read_timeout_s=day,
        breaker_recovery_s=day,
    )
    assert (config.request_timeout_s, config.breaker_recovery_s) == (day, day)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.1, 2.01, 5.0, True, "0.3"])
def test_a_temperature_outside_0_to_2_is_refused(value: object) -> None:
    # NaN and inf were taken, and every call then raised a bare ValueError ("Out of range float
    # values are not JSON compliant") encoding the body; 5 and -1 were taken, and every call
    # was refused by the endpoint with a 400 (OpenAI takes 0 to 2).
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url="http://llm.test/v1", api_key=KEY, temperature=value)  # type: ignore[arg-type]
    assert raised.value.field == "temperature"


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.0])
def test_a_temperature_from_0_to_2_is_taken(value: float) -> None:
    assert ClientConfig(base_url="http://llm.test/v1", api_key=KEY, temperature=value).temperature == value


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("default_model", " gpt-4.1", "default_model: must have no space around it"),
        ("default_model", "gp\x01t", r"default_model: must not contain control characters \(found U\+0001\)"),
        ("default_model", "m" * 201, "default_model: must be at most 200 characters, got 201"),
        ("provider", "p" * 201, "provider: must be at most 200 characters, got 201"),
        ("provider", "openai\n", r"provider: must not contain control characters \(found U\+000A\)"),
        ("provider", "\u200b", "provider: must hold a visible character"),
    ],
)
def test_a_default_model_or_provider_that_is_no_name_is_refused_when_configured(
    field: str, value: str, message: str
) -> None:
    # A provider of 300 characters was taken, and every call it made was paid for and then
    # unrecordable (it is each call's usage.provider); a default model with a control
    # character refused every call as a "model" the caller never gave; " gpt-4.1" was asked for
    with pytest.raises(ValidationError, match=f"^{message}"):
        ClientConfig(base_url="http://127.0.0.1:1/v1", api_key=KEY, **{field: value})


def test_a_default_model_and_provider_in_any_script_are_taken() -> None:
    config = ClientConfig(
        base_url="http://127.0.0.1:1/v1", api_key=KEY, default_model="通义千问", provider="阿里云"
    )
    assert (config.default_model, config.provider) == ("通义千问", "阿里云")


@pytest.mark.parametrize("value", [0, -1, MAX_COMPLETION_TOKENS + 1, 10**41, True, 1.5, "256"])
def test_a_token_cap_no_model_takes_is_refused_when_configured(value: object) -> None:
    # 10**41 (FLOWLEDGER_LLM_MAX_TOKENS too) was taken, and every call was then refused by the
    # endpoint (OpenAI's "max_tokens is too large"; the simulator's integer_above_max_value) or
    # reserved against a budget as the largest reply it allows.
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url="http://llm.test/v1", api_key=KEY, max_tokens=value)  # type: ignore[arg-type]
    assert raised.value.field == "max_tokens"
    assert f"{MAX_COMPLETION_TOKENS:,}" in str(raised.value)


@pytest.mark.parametrize("value", [1, 1024, MAX_COMPLETION_TOKENS])
def test_a_token_cap_from_one_to_the_largest_completion_is_taken(value: int) -> None:
    assert ClientConfig(base_url="http://llm.test/v1", api_key=KEY, max_tokens=value).max_tokens == value


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # Each refusal quoted the URL whole, password or query key included, into the CLI's
        # line and the service's start-up log (`flowledger serve` printed the first two so).
        ("https://user:secret@llm.test:99999/v1", "'https://***@llm.test:99999/v1'"),
        ("https://llm.test/v1?api-key=secret", "'https://llm.test/v1?***'"),
        ("ftp://llm.test/v1?api-key=secret", "'ftp://llm.test/v1?***'"),
        ("https://llm.test/v1?api-key=secret x", "'https://llm.test/v1?***'"),
        ("https://user:secret@llm.test/v 1#secret", "'https://***@llm.test/v 1#***'"),
        ("http://user:secret@[::1/v1", "'http://***@[::1/v1'"),
    ],
)
def test_a_refused_endpoint_url_is_quoted_without_its_credentials_or_query(url: str, shown: str) -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url=url, api_key=KEY)
    assert "secret" not in str(raised.value)
    assert shown in str(raised.value)


def test_the_settings_never_show_the_llm_api_key_in_their_repr() -> None:
    # repr(Settings(...)) printed llm_api_key='sk-...' whole, as the other secrets never were.
    assert "sk-config-secret" not in repr(Settings(llm_api_key="sk-config-secret"))


@pytest.mark.parametrize(
    "limits",
    [
        {"rpm": 0, "tpm": 1},
        {"rpm": math.nan, "tpm": 1_000},
        {"rpm": 1.5, "tpm": 1_000},
        {"rpm": True, "tpm": 1_000},
        {"rpm": "5", "tpm": 1_000},
        {"rpm": 10, "tpm": math.inf},
        {"rpm": 10, "tpm": 1_000, "period_s": math.inf},
        {"rpm": 10, "tpm": 1_000, "period_s": math.nan},
        {"rpm": 10, "tpm": 1_000, "period_s": "60"},
        {"rpm": 10, "tpm": 1_000, "period_s": 0},
    ],
    ids=repr,
)
def test_a_rate_limit_that_is_no_count_per_period_is_refused_when_configured(
    limits: dict[str, object],
) -> None:
    # (NaN failed every call with aiolimiter's bare ValueError, "5" and "60" a TypeError here,
    # an infinite period let no request through, 1.5 or True were taken as counts.)
    with pytest.raises(ValidationError) as raised:
        ModelLimits(**limits)  # type: ignore[arg-type]
    assert raised.value.field.startswith("limits")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # Each failed every call with a bare AttributeError ('int' object has no attribute 'rpm')
        ("limits", {"gpt-4.1": 5}),
        ("limits", 5),
        ("limits", {5: ModelLimits(rpm=1, tpm=1)}),
        ("default_limits", 5),
        # A flag that is no bool: "no" is true in Python, so every reply was streamed
        ("stream", "no"),
        ("stream", 1),
        # Counts that are bools or no whole numbers
        ("max_retries", True),
        ("max_retries", 1.5),
        ("max_connections", True),
        ("pool_shard_size", 2.5),
        ("breaker_failure_threshold", True),
    ],
    ids=repr,
)
def test_a_setting_of_the_wrong_kind_is_refused_when_configured(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url="http://llm.test/v1", api_key=KEY, **{field: value})  # type: ignore[arg-type]
    assert raised.value.field.split(".")[0] == field


def test_rate_limits_per_model_and_a_default_are_taken() -> None:
    limits = {
        "gpt-4.1": ModelLimits(rpm=500, tpm=200_000),
        "deepseek-v3.2": ModelLimits(rpm=1, tpm=1, period_s=1.5),
    }
    config = ClientConfig(
        base_url="http://llm.test/v1",
        api_key=KEY,
        limits=limits,
        default_limits=ModelLimits(rpm=60, tpm=10_000),
    )
    assert config.limits == limits


@pytest.mark.parametrize("key", ["sk-config-1234\n", "sk-config-1234\r\n", "\nsk-config-1234"], ids=repr)
def test_an_api_key_with_a_line_break_is_refused_when_configured(key: str) -> None:
    # (A key read from a file or a secret with its trailing newline: "$" matched before it, and
    # every call failed with aiohttp's bare ValueError "Forbidden control character detected in
    # headers", recorded as a failed step.)
    with pytest.raises(ValidationError) as raised:
        ApiKey(key)
    assert raised.value.field == "llm_api_key"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # Each was a bare TypeError or AttributeError out of the constructor
        ("request_timeout_s", "5"),
        ("breaker_recovery_s", "3"),
        ("read_timeout_s", "1"),
        ("base_url", 5),
        ("default_model", 5),
        # A bool taken as a second, a fraction of a byte
        ("request_timeout_s", True),
        ("max_reply_bytes", 2048.5),
    ],
    ids=repr,
)
def test_a_value_of_the_wrong_type_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(**{"base_url": "http://llm.test/v1", "api_key": KEY, field: value})  # type: ignore[arg-type]
    assert raised.value.field == ("llm_base_url" if field == "base_url" else field)


@pytest.mark.parametrize("prices", [None, 5, {}], ids=repr)
def test_a_client_needs_a_price_table(prices: object) -> None:
    # (An AttributeError: 'NoneType' object has no attribute 'resolve')
    with pytest.raises(ValidationError) as raised:
        OpenAICompatibleClient(ClientConfig(base_url="http://llm.test/v1", api_key=KEY), prices=prices)  # type: ignore[arg-type]
    assert raised.value.field == "prices"


@pytest.mark.parametrize(
    ("field", "call"),
    [
        # Each was a bare AttributeError out of the request's building, or taken as given
        ("messages", {"model": None, "messages": "hi"}),
        ("messages", {"model": None, "messages": [5]}),
        ("messages", {"model": None, "messages": [{"role": "user", "content": "hi"}, None]}),
        ("model", {"model": 5, "messages": [{"role": "user", "content": "hi"}]}),
        ("json_mode", {"model": None, "messages": [{"role": "user", "content": "hi"}], "json_mode": "no"}),
    ],
    ids=["text", "a number", "a None", "model 5", "json_mode 'no'"],
)
async def test_a_completion_asked_with_arguments_of_the_wrong_kind_is_refused_before_any_request(
    field: str, call: dict[str, object]
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent")

    client = OpenAICompatibleClient(
        ClientConfig(base_url="http://llm.test/v1", api_key=KEY),
        prices=load_price_table(),
        transport=httpx.MockTransport(refuse),
    )
    try:
        with pytest.raises(ValidationError) as raised:
            await client.complete(**call)  # type: ignore[arg-type]
        assert raised.value.field == field
    finally:
        await client.aclose()
