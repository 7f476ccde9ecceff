"""A 429 that says the account's quota is used up (``insufficient_quota``) is no rate limit:
OpenAI's error codes guide says the credits or the monthly spend are exhausted, which no retry
mends. It fails at once, is not retried, passes on no wait and does not touch the breaker."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.resilience import STATE_CLOSED
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.errors import LlmCallFailed
from flowledger.infrastructure import Engine
from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

MESSAGES = [{"role": "user", "content": "hello"}]
QUOTA_MESSAGE = "You exceeded your current quota, please check your plan and billing details."


def quota_error(**fields: Any) -> bytes:
    """OpenAI's error body, pretty-printed as OpenAI sends it, with ``fields`` over its defaults."""
    error = {
        "message": QUOTA_MESSAGE,
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
    return json.dumps({"error": {**error, **fields}}, indent=2).encode()


async def _no_sleep(_: float) -> None:
    return None


@pytest.mark.parametrize(
    "body",
    [quota_error(), quota_error(type="invalid_request_error"), quota_error(code=None)],
    ids=["type-and-code", "code-only", "type-only"],
)
async def test_a_429_for_an_exhausted_quota_fails_at_once_and_is_not_retried(
    transport: Transports, body: bytes
) -> None:
    # Given an endpoint whose account has run out of quota (it answers 429, with a wait)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            429, content=body, headers={"content-type": "application/json", "retry-after": "1"}
        )

    llm = await transport.client(handler, stream=False, max_retries=2, retry_sleep=_no_sleep)
    # When a completion is asked for
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then one request went out (it was retried twice, as a rate limit, each a wasted request)
    assert len(seen) == 1
    error = raised.value
    assert (error.error_type, error.status_code, error.attempts) == ("insufficient_quota", 429, 1)
    # and no wait is passed on, as if coming back later would help
    assert error.retry_after_s is None
    assert QUOTA_MESSAGE in str(error)
    assert "quota" in str(error)
    assert "retrying will not help" in str(error)
    # and the breaker judged nothing: the endpoint is well, the account is not
    assert (llm.breaker.state, llm.breaker.failure_count) == (STATE_CLOSED, 0)


async def test_a_plain_rate_limit_429_is_still_retried(transport: Transports) -> None:
    # The control: a 429 for the rate is retried, as the SDK does
    seen: list[httpx.Request] = []
    limited = json.dumps(
        {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    )

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(429, content=limited.encode(), headers={"content-type": "application/json"})

    llm = await transport.client(handler, stream=False, max_retries=2, retry_sleep=_no_sleep)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert (raised.value.error_type, len(seen)) == ("http_429", 3)


async def test_an_exhausted_quota_sent_inside_a_stream_is_not_retried(transport: Transports) -> None:
    # Given a proxy that sends the quota error inside a stream (OpenRouter, LiteLLM do)
    seen: list[httpx.Request] = []
    chunk = json.dumps({"error": {"message": QUOTA_MESSAGE, "code": "insufficient_quota"}})

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, content=f"data: {chunk}\n\n".encode(), headers={"content-type": "text/event-stream"}
        )

    llm = await transport.client(handler, stream=True, max_retries=2, retry_sleep=_no_sleep)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then it fails at once (it was "stream_rate_limited", retried twice)
    assert (raised.value.error_type, len(seen)) == ("insufficient_quota", 1)
    assert "retrying will not help" in str(raised.value)
    assert (llm.breaker.state, llm.breaker.failure_count) == (STATE_CLOSED, 0)


async def test_an_exhausted_quota_is_a_step_failed_with_that_reason(engine: Engine) -> None:
    # Given an engine whose model endpoint's account has run out of quota
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(429, content=quota_error(), headers={"content-type": "application/json"})

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), stream=False)
    engine.llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=_no_sleep
    )
    engine.start_session("s1", "customer_service")
    # When a step calls the model
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"})
    # Then the step failed once, not retried, with the quota named as its reason
    [failure] = engine.get_session("s1").failures
    assert (failure.error_type, len(seen)) == ("insufficient_quota", 1)
    assert QUOTA_MESSAGE in failure.error_message
    assert "retrying will not help" in failure.error_message
    assert failure.error_detail == {"error": "LlmCallFailed", "attempts": 1, "status_code": 429}
    await engine.llm.aclose()  # type: ignore[union-attr]


class _AskingForTheQuotaFault(httpx.AsyncHTTPTransport):
    """httpx's transport, every request asking the simulator for its exhausted-quota answer."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["x-sim-fault"] = "insufficient_quota"
        return await super().handle_async_request(request)


async def test_the_simulator_answers_an_exhausted_quota_on_request_and_the_adapter_fails_at_once() -> None:
    # Given the simulator, asked per request for OpenAI's exhausted-quota answer
    with run_simulator(SimulatorConfig(latency_ms=0)) as simulator:
        async with openai.AsyncOpenAI(
            base_url=simulator.base_url, api_key="sk-simulator", max_retries=0
        ) as sdk:
            with pytest.raises(openai.RateLimitError) as refused:
                await sdk.chat.completions.create(
                    model="gpt-4.1",
                    messages=[{"role": "user", "content": "hello"}],
                    extra_headers={"x-sim-fault": "insufficient_quota"},
                )
        # Then the SDK sees OpenAI's 429 with its type and code (the header was a 400: no such
        # fault), and no wait, as quota is not a rate
        assert (refused.value.status_code, refused.value.code) == (429, "insufficient_quota")
        assert refused.value.type == "insufficient_quota"
        assert "retry-after" not in refused.value.response.headers
        # And the adapter, sent it at every request, fails at once: one request, not three
        config = ClientConfig(base_url=simulator.base_url, api_key=ApiKey("sk-simulator"), max_retries=2)
        llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=_AskingForTheQuotaFault())
        try:
            with pytest.raises(LlmCallFailed) as raised:
                # (not JSON mode: the simulator, as OpenAI, refuses one whose messages never say "JSON")
                await llm.complete(model="gpt-4.1", messages=MESSAGES, json_mode=False)
        finally:
            await llm.aclose()
        assert (raised.value.error_type, raised.value.attempts) == ("insufficient_quota", 1)
        assert simulator.stats["fault_insufficient_quota"] == 2
