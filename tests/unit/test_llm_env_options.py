"""The client settings a server takes from its environment (``adapters/llm/env_options.py``):
``flowledger serve`` had no way to set limits, timeouts, retries, the breaker or streaming."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, ModelLimits, OpenAICompatibleClient
from flowledger.adapters.llm.env_options import client_options_from_env
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings

ENV = {
    "FLOWLEDGER_LLM_DEFAULT_MODEL": "gpt-4.1",
    "FLOWLEDGER_LLM_CONNECT_TIMEOUT_S": "2",
    "FLOWLEDGER_LLM_REQUEST_TIMEOUT_S": "7.5",
    "FLOWLEDGER_LLM_READ_TIMEOUT_S": "3",
    "FLOWLEDGER_LLM_MAX_RETRIES": "4",
    "FLOWLEDGER_LLM_MAX_TOKENS": "256",
    "FLOWLEDGER_LLM_STREAM": "yes",
    "FLOWLEDGER_LLM_UNPRICED_MODELS": "flag",
    "FLOWLEDGER_LLM_BREAKER_THRESHOLD": "3",
    "FLOWLEDGER_LLM_BREAKER_RECOVERY_S": "10",
    "FLOWLEDGER_LLM_RPM": "60",
    "FLOWLEDGER_LLM_TPM": "100000",
    "FLOWLEDGER_LLM_MAX_REPLY_BYTES": "1048576",
    "FLOWLEDGER_LLM_KEEPALIVE_S": "2.5",
}


async def test_a_client_built_from_settings_takes_its_options_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    settings = Settings(
        database_url="memory:",
        home=Path("/nonexistent"),
        llm_base_url="http://127.0.0.1:9/v1",
        llm_api_key="sk-env-1234",
    )
    llm = OpenAICompatibleClient.from_settings(settings)
    config = llm.config
    assert (config.default_model, config.connect_timeout_s, config.request_timeout_s) == ("gpt-4.1", 2.0, 7.5)
    assert config.read_timeout_s == 3.0
    assert (config.max_retries, config.max_tokens, config.stream) == (4, 256, True)
    assert (config.unpriced_models, config.breaker_failure_threshold, config.breaker_recovery_s) == (
        "flag",
        3,
        10.0,
    )
    assert config.default_limits == ModelLimits(rpm=60, tpm=100_000)
    assert config.max_reply_bytes == 1_048_576
    assert config.keepalive_expiry_s == 2.5
    # And an option given in code wins over the environment
    assert OpenAICompatibleClient.from_settings(settings, max_retries=0).config.max_retries == 0
    await llm.aclose()


def test_no_variables_set_no_options() -> None:
    assert client_options_from_env({}) == {}


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"FLOWLEDGER_LLM_MAX_RETRIES": "three"}, "FLOWLEDGER_LLM_MAX_RETRIES"),
        ({"FLOWLEDGER_LLM_REQUEST_TIMEOUT_S": "soon"}, "FLOWLEDGER_LLM_REQUEST_TIMEOUT_S"),
        ({"FLOWLEDGER_LLM_STREAM": "maybe"}, "FLOWLEDGER_LLM_STREAM"),
        ({"FLOWLEDGER_LLM_RPM": "60"}, "FLOWLEDGER_LLM_RPM"),
        ({"FLOWLEDGER_LLM_RPM": "60", "FLOWLEDGER_LLM_TPM": "lots"}, "FLOWLEDGER_LLM_RPM"),
    ],
)
def test_a_value_that_does_not_read_names_its_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        client_options_from_env(env)
    assert raised.value.field == field


def _settings(base_url: str) -> Settings:
    return Settings(
        database_url="memory:", home=Path("/nonexistent"), llm_base_url=base_url, llm_api_key="sk-env-1234"
    )


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_transport_named_in_the_options_or_the_environment_is_the_one_calls_go_through(
    monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    # ``from_settings(settings, transport="httpx")`` took the name for an httpx transport
    # object: the client was built, and its first call failed with AttributeError ('str'
    # object has no attribute 'handle_async_request'), recorded as a failed step.
    with run_simulator(SimulatorConfig(latency_ms=1, seed=3)) as simulator:
        settings = _settings(simulator.base_url)
        named = OpenAICompatibleClient.from_settings(settings, transport=transport)
        monkeypatch.setenv("FLOWLEDGER_LLM_TRANSPORT", transport)
        from_env = OpenAICompatibleClient.from_settings(settings)
        for llm in (named, from_env):
            # When
            reply = await llm.complete(
                model="deepseek-v3.2", messages=[{"role": "user", "content": "hi, in JSON"}]
            )
            # Then
            assert llm.config.transport == transport
            assert reply.usage.attempts == 1
            assert reply.usage.output_tokens > 0
            await llm.aclose()


def test_an_unknown_transport_in_the_environment_names_its_variable() -> None:
    with pytest.raises(ValidationError) as raised:
        client_options_from_env({"FLOWLEDGER_LLM_TRANSPORT": "curl"})
    assert raised.value.field == "FLOWLEDGER_LLM_TRANSPORT"
    assert "aiohttp, httpx" in str(raised.value)


@pytest.mark.parametrize(("rpm", "tpm"), [("0", "1000"), ("60", "-5")])
def test_limits_below_one_are_refused_for_what_they_are(rpm: str, tpm: str) -> None:
    # '0' was refused as "rpm and tpm must be whole numbers, got '0'/'1000'": it is one.
    with pytest.raises(ValidationError) as raised:
        client_options_from_env({"FLOWLEDGER_LLM_RPM": rpm, "FLOWLEDGER_LLM_TPM": tpm})
    assert raised.value.field == "FLOWLEDGER_LLM_RPM"
    assert "must be >= 1" in str(raised.value)
    assert "whole numbers" not in str(raised.value)


@pytest.mark.parametrize("unpriced", ["refuse", "flag"])
def test_a_default_model_named_without_a_price_is_refused_unless_unpriced_calls_are_flagged(
    monkeypatch: pytest.MonkeyPatch, unpriced: str
) -> None:
    # FLOWLEDGER_LLM_DEFAULT_MODEL=gpt-4.2 was taken: serve started, and every step that named
    # no model was then refused (422, UnknownModelPrice).
    monkeypatch.setenv("FLOWLEDGER_LLM_DEFAULT_MODEL", "gpt-4.2")
    monkeypatch.setenv("FLOWLEDGER_LLM_UNPRICED_MODELS", unpriced)
    settings = _settings("http://127.0.0.1:9/v1")
    if unpriced == "flag":
        assert OpenAICompatibleClient.from_settings(settings).config.default_model == "gpt-4.2"
        return
    with pytest.raises(ValidationError) as raised:
        OpenAICompatibleClient.from_settings(settings)
    assert raised.value.field == "default_model"
    assert "'gpt-4.2' has no price in flowledger-" in str(raised.value)


def test_the_built_in_default_model_is_not_required_of_a_price_file(tmp_path: Path) -> None:
    # A table of one's own models, none named as the default: steps name their model.
    path = tmp_path / "prices.json"
    path.write_text(
        '{"version": "v1", "models": {"m1": {"input_cost_per_token": 1, "output_cost_per_token": 2}}}'
    )
    settings = Settings(
        database_url="memory:",
        home=Path("/nonexistent"),
        llm_base_url="http://127.0.0.1:9/v1",
        llm_api_key="sk-env-1234",
        pricing_file=path,
    )
    llm = OpenAICompatibleClient.from_settings(settings)
    assert not llm.prices.knows(llm.config.default_model)


async def test_a_request_timeout_below_the_default_connect_timeout_bounds_connecting_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given only a request timeout of 1 s (`serve` refused to start: "connect_timeout_s: cannot
    # exceed request_timeout_s", a timeout nobody set, at its default of 5 s)
    monkeypatch.setenv("FLOWLEDGER_LLM_REQUEST_TIMEOUT_S", "1")
    settings = Settings(
        database_url="memory:",
        home=Path("/nonexistent"),
        llm_base_url="http://127.0.0.1:9/v1",
        llm_api_key="sk-env-1234",
    )
    # When the client is built, Then connecting is bounded by the attempt's deadline
    llm = OpenAICompatibleClient.from_settings(settings)
    assert (llm.config.connect_timeout_s, llm.config.request_timeout_s) == (1.0, 1.0)
    await llm.aclose()
    # And left to both defaults, connecting keeps its 5 s
    assert (
        ClientConfig(base_url="http://127.0.0.1:9/v1", api_key=ApiKey("sk-env-1234")).connect_timeout_s == 5.0
    )


def test_a_connect_timeout_set_past_the_request_timeout_is_refused_with_both_values() -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(
            base_url="http://127.0.0.1:9/v1",
            api_key=ApiKey("sk-env-1234"),
            connect_timeout_s=5,
            request_timeout_s=1,
        )
    assert raised.value.field == "connect_timeout_s"
    assert "cannot exceed request_timeout_s: 5 s > 1 s" in str(raised.value)
