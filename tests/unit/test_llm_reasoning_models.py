"""OpenAI's reasoning models (o1, o3, o4-mini, gpt-5) take ``max_completion_tokens``, not
``max_tokens``, and only their default temperature: the simulator refuses the rest as OpenAI
does, and the client asks such a model the way it takes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.simulator import Simulator, SimulatorConfig, run_simulator

MESSAGES: list[Any] = [{"role": "user", "content": "hello, in JSON"}]
REASONING = ["o1", "o3", "o3-mini", "o4-mini-2025-04-16", "gpt-5", "gpt-5-mini", "gpt-5.1"]


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with run_simulator(SimulatorConfig(latency_ms=0, seed=3)) as running:
        yield running


def sdk(simulator: Simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=simulator.base_url, api_key="sk-sim-000000", max_retries=0, timeout=5)


@pytest.mark.parametrize("model", REASONING)
def test_the_simulator_refuses_max_tokens_for_a_reasoning_model_as_openai_does(
    simulator: Simulator, model: str
) -> None:
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=100)
    assert refused.value.body == {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model."
        " Use 'max_completion_tokens' instead.",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "unsupported_parameter",
    }


@pytest.mark.parametrize("model", REASONING)
def test_the_simulator_refuses_a_temperature_other_than_1_for_a_reasoning_model(
    simulator: Simulator, model: str
) -> None:
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, temperature=0.3)
    assert refused.value.body == {
        "message": "Unsupported value: 'temperature' does not support 0.3 with this model."
        " Only the default (1) value is supported.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }


@pytest.mark.parametrize(
    ("model", "fields", "param"),
    [
        ("o3", {"top_p": 0.9}, "top_p"),
        ("o1", {"top_p": 1}, "top_p"),
        ("o4-mini", {"presence_penalty": 0.5}, "presence_penalty"),
        ("gpt-5", {"frequency_penalty": -1}, "frequency_penalty"),
        ("o3-mini", {"logprobs": True}, "logprobs"),
        ("gpt-5.1", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ("o3", {"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
def test_the_simulator_refuses_sampling_fields_a_reasoning_model_does_not_take(
    simulator: Simulator, model: str, fields: dict[str, Any], param: str
) -> None:
    # Each was answered 200: a client sending top_p or a penalty to o3 passed here and was
    # refused every call by OpenAI, as it refuses max_tokens and a temperature.
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, **fields)
    assert refused.value.body == {
        "message": f"Unsupported parameter: '{param}' is not supported with this model.",
        "type": "invalid_request_error",
        "param": param,
        "code": "unsupported_parameter",
    }


@pytest.mark.parametrize("model", ["gpt-4.1", "deepseek-v3.2", "gpt-5-chat-latest"])
def test_other_models_take_the_sampling_fields(simulator: Simulator, model: str) -> None:
    fields: dict[str, Any] = {
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -1,
        "logprobs": True,
    }
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, logit_bias={"50256": -100}, top_logprobs=2, **fields
        )
    assert reply.choices[0].message.content


def test_a_reasoning_model_takes_logprobs_false(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model="o3", messages=MESSAGES, logprobs=False)
    assert reply.choices[0].message.content


@pytest.mark.parametrize(
    "model", ["gpt-4.1", "gpt-4o-mini", "deepseek-v3.2", "o-series-lookalike", "gpt-5-chat-latest"]
)
def test_other_models_take_max_tokens_and_a_temperature(simulator: Simulator, model: str) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=100, temperature=0.3
        )
    assert reply.choices[0].message.content


def test_a_reasoning_model_takes_max_completion_tokens_and_its_default_temperature(
    simulator: Simulator,
) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model="o4-mini", messages=MESSAGES, max_completion_tokens=100, temperature=1
        )
    assert reply.choices[0].message.content


@pytest.mark.parametrize("model", ["o4-mini", "openai/o3", "gpt-5", "gpt-4.1"])
async def test_the_client_asks_a_reasoning_model_for_max_completion_tokens_without_a_temperature(
    model: str,
) -> None:
    # Given
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "id": "c",
                "model": model,
                "choices": [{"message": {"content": '{"message": "hi"}'}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            },
        )

    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        unpriced_models="flag",
        max_tokens=500,
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(handler))
    # When
    await llm.complete(model=model, messages=MESSAGES)
    await llm.aclose()
    # Then
    body = sent[0]
    if model == "gpt-4.1":
        assert (body["max_tokens"], body["temperature"]) == (500, 0.3)
        assert "max_completion_tokens" not in body
    else:
        assert body["max_completion_tokens"] == 500
        assert "max_tokens" not in body
        assert "temperature" not in body


async def test_the_client_calls_a_reasoning_model_on_the_simulator(simulator: Simulator) -> None:
    config = ClientConfig(
        base_url=simulator.base_url, api_key=ApiKey("sk-test-secret-1"), unpriced_models="flag"
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    reply = await llm.complete(model="o4-mini", messages=MESSAGES)
    await llm.aclose()
    assert reply.content
    assert reply.usage.attempts == 1


@pytest.mark.parametrize("model", ["o4-mini", "gpt-5"])
def test_the_simulator_reports_a_reasoning_models_thinking_tokens(simulator: Simulator, model: str) -> None:
    # They were reported as 0: a reasoning model's cost, most of it thinking, was simulated without it
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model=model, messages=MESSAGES)
    usage = reply.usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    reasoning = usage.completion_tokens_details.reasoning_tokens or 0
    assert 16 <= reasoning < usage.completion_tokens
