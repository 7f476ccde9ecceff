"""The client settings a server takes from its environment (``adapters/llm/env_options.py``):
``flowledger serve`` had no way to set limits, timeouts, retries, the breaker or streaming."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowledger.adapters.llm import ModelLimits, OpenAICompatibleClient
from flowledger.adapters.llm.env_options import client_options_from_env
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
