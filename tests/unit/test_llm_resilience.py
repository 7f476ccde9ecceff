"""The endpoint circuit breaker's states and the per-model rate limits."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    ModelLimits,
    OpenAICompatibleClient,
    load_price_table,
)
from flowledger.adapters.llm.resilience import (
    STATE_CLOSED,
    STATE_HALF_OPEN,
    STATE_OPEN,
    ModelRateLimiter,
)
from flowledger.domain.errors import CircuitOpen, LlmCallFailed
from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

OK = {
    "id": "c",
    "model": "deepseek-v3.2",
    "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}
MESSAGES = [{"role": "user", "content": "hi"}]


class Endpoint:
    """A scripted endpoint: answers with ``status`` (mutable) and counts requests."""

    def __init__(self, status: int = 503, delay: float = 0.0) -> None:
        self.status = status
        self.delay = delay
        self.requests = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        await asyncio.sleep(self.delay)
        if self.status == 200:
            return httpx.Response(200, json=OK)
        return httpx.Response(self.status, json={"error": {"message": "x"}})


def client(endpoint: Endpoint, **options: Any) -> OpenAICompatibleClient:
    defaults: dict[str, Any] = {"max_retries": 0, "breaker_failure_threshold": 3, "breaker_recovery_s": 0.1}
    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), **{**defaults, **options}
    )
    return OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(endpoint))


async def served_client(transport: Transports, endpoint: Endpoint, **options: Any) -> OpenAICompatibleClient:
    """``client``, through the mock, aiohttp's transport or httpx's pool (the fixture's kind)."""
    defaults: dict[str, Any] = {"max_retries": 0, "breaker_failure_threshold": 3, "breaker_recovery_s": 0.1}
    return await transport.client(endpoint, **{**defaults, **options})


async def fail_times(llm: OpenAICompatibleClient, n: int) -> None:
    for _ in range(n):
        with pytest.raises(LlmCallFailed):
            await llm.complete(model="deepseek-v3.2", messages=MESSAGES)


async def test_the_breaker_opens_after_consecutive_server_failures_and_then_fails_fast(
    transport: Transports,
) -> None:
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 2)
    assert llm.breaker.state == STATE_CLOSED
    await fail_times(llm, 1)
    assert llm.breaker.state == STATE_OPEN
    with pytest.raises(CircuitOpen) as raised:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert endpoint.requests == 3
    assert raised.value.error_type == "circuit_open"
    assert raised.value.endpoint == llm.config.endpoint
    assert raised.value.endpoint.endswith("/v1/chat/completions")
    assert "open" in str(raised.value)
    # The failed-fast call still names its model, with no tokens and no cost
    usage = raised.value.usage
    assert usage is not None
    assert (usage.request_model, usage.input_tokens, usage.cost_usd) == ("deepseek-v3.2", 0, 0)
    # and says no request went out: 0 attempts (its usage said 1)
    assert (raised.value.attempts, usage.attempts, usage.extra["attempt_log"]) == (0, 0, [])
    await llm.aclose()


async def test_after_the_cool_down_one_successful_trial_closes_the_breaker(transport: Transports) -> None:
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 3)
    await asyncio.sleep(0.12)
    assert llm.breaker.state == STATE_HALF_OPEN
    endpoint.status = 200
    await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert llm.breaker.state == STATE_CLOSED
    assert llm.breaker.failure_count == 0
    await llm.aclose()


async def test_a_failed_trial_opens_the_breaker_again(transport: Transports) -> None:
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 3)
    await asyncio.sleep(0.12)
    await fail_times(llm, 1)
    assert llm.breaker.state == STATE_OPEN
    assert endpoint.requests == 4
    await llm.aclose()


async def test_while_half_open_only_one_trial_goes_out_and_the_others_fail_fast(
    transport: Transports,
) -> None:
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 3)
    await asyncio.sleep(0.12)
    endpoint.status, endpoint.delay = 200, 0.05
    results = await asyncio.gather(
        *(llm.complete(model="deepseek-v3.2", messages=MESSAGES) for _ in range(5)), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert sum(isinstance(r, CircuitOpen) for r in results) == 4
    assert endpoint.requests == 4
    assert llm.breaker.state == STATE_CLOSED
    await llm.aclose()


async def test_a_call_refused_while_the_half_open_trial_runs_says_the_trial_is_under_way(
    transport: Transports,
) -> None:
    # Given a half-open breaker whose trial call takes a while
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 3)
    await asyncio.sleep(0.12)
    endpoint.status, endpoint.delay = 200, 0.2
    trial = asyncio.ensure_future(llm.complete(model="deepseek-v3.2", messages=MESSAGES))
    await asyncio.sleep(0.05)
    # When another call comes while it runs
    with pytest.raises(CircuitOpen) as refused:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    await trial
    # Then it is told that a trial is under way, not that one is due at once ("next trial in 0.0s")
    assert refused.value.trial_running
    assert "its trial call is under way" in str(refused.value)
    assert "next trial in" not in str(refused.value)
    assert endpoint.requests == 4
    await llm.aclose()


async def test_client_errors_do_not_count_against_the_endpoint(transport: Transports) -> None:
    endpoint = Endpoint(400)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 5)
    assert llm.breaker.state == STATE_CLOSED
    await llm.aclose()


async def test_a_client_error_between_server_failures_does_not_clear_their_count(
    transport: Transports,
) -> None:
    # (A 429 or 400 reset the count: 503, 503, 429, 503, 503, 429 ... never opened it.)
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 2)
    endpoint.status = 429
    await fail_times(llm, 1)
    endpoint.status = 503
    await fail_times(llm, 1)
    assert llm.breaker.state == STATE_OPEN
    await llm.aclose()


async def test_a_half_open_trial_that_gets_a_client_error_does_not_close_the_breaker(
    transport: Transports,
) -> None:
    # (A 429 answered to the trial closed the breaker: only a success closes it.)
    endpoint = Endpoint(503)
    llm = await served_client(transport, endpoint)
    await fail_times(llm, 3)
    await asyncio.sleep(0.12)
    endpoint.status = 429
    await fail_times(llm, 1)
    assert llm.breaker.state == STATE_HALF_OPEN
    endpoint.status = 200
    await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert llm.breaker.state == STATE_CLOSED
    await llm.aclose()


async def test_a_breaker_opening_mid_retry_stops_the_retries() -> None:
    async def instant(_: float) -> None:
        return None

    endpoint = Endpoint(500)
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        max_retries=5,
        breaker_failure_threshold=2,
    )
    llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(endpoint), retry_sleep=instant
    )
    with pytest.raises(CircuitOpen) as raised:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert endpoint.requests == 2
    assert raised.value.attempts == 2
    assert raised.value.usage is not None
    assert raised.value.usage.attempts == 2
    await llm.aclose()


async def test_a_breaker_opening_mid_retry_says_which_failures_opened_it() -> None:
    async def instant(_: float) -> None:
        return None

    # Given an endpoint failing with 500s and a breaker that opens after two
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        max_retries=5,
        breaker_failure_threshold=2,
    )
    llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(Endpoint(500)), retry_sleep=instant
    )
    # When one call's own attempts open it
    with pytest.raises(CircuitOpen) as raised:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    # Then its error names what the endpoint did (it said only that the circuit was open, as
    # if no request had gone out: the 500s were in no message)
    assert raised.value.opened_by == "http_500, http_500"
    assert str(raised.value).endswith("(after this call's 2 attempt(s): http_500, http_500)")
    # And a call refused by the open breaker, which sent nothing, says nothing of the kind
    with pytest.raises(CircuitOpen) as refused:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert refused.value.opened_by == ""
    assert str(refused.value).endswith("s")
    await llm.aclose()


async def test_requests_per_minute_are_limited_per_model() -> None:
    limiter = ModelRateLimiter({"gpt-4.1": ModelLimits(rpm=2, tpm=10_000, period_s=0.2)}, default=None)
    started = time.perf_counter()
    for _ in range(4):
        await limiter.acquire("gpt-4.1", 10)
    limited = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(50):
        await limiter.acquire("deepseek-v3.2", 10)
    unlimited = time.perf_counter() - started
    # Two fit in the bucket; the next two wait for it to leak (0.1 s each).
    assert limited >= 0.15
    assert unlimited < 0.05


async def test_tokens_per_minute_are_limited_per_model() -> None:
    limiter = ModelRateLimiter({}, default=ModelLimits(rpm=1000, tpm=1000, period_s=0.2))
    started = time.perf_counter()
    await limiter.acquire("m", 1000)
    await limiter.acquire("m", 500)
    assert time.perf_counter() - started >= 0.08
    # A request bigger than the whole budget is capped to it, not stuck for ever.
    await asyncio.wait_for(limiter.acquire("other", 50_000), timeout=1)


async def test_the_client_waits_for_the_rate_limit_and_records_the_wait(transport: Transports) -> None:
    endpoint = Endpoint(200)
    llm = await served_client(
        transport, endpoint, limits={"deepseek-v3.2": ModelLimits(rpm=1, tpm=100_000, period_s=0.5)}
    )
    started = time.perf_counter()
    first = await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    first_took_ms = (time.perf_counter() - started) * 1000
    second = await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    # The second waits out what the first call left of the period (500 ms per request: a
    # loaded machine can make the call itself take some of it); the first does not wait for
    # it (only for the machine: no bound of its own, as a loaded machine stalls any loop).
    assert first_took_ms + second.usage.extra["rate_limit_wait_ms"] >= 450
    assert first.usage.extra["rate_limit_wait_ms"] < 250
    await llm.aclose()


async def test_every_attempt_waits_for_the_models_limits_not_only_the_first() -> None:
    # (Retries went out without waiting: 18 requests in one second under rpm=5 per second.)
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.perf_counter())
        return httpx.Response(503 if len(seen) < 4 else 200, json=OK)

    async def no_sleep(_: float) -> None:
        return None

    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        max_retries=3,
        limits={"deepseek-v3.2": ModelLimits(rpm=1, tpm=100_000, period_s=0.1)},
    )
    llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=no_sleep
    )
    await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    await llm.aclose()
    # Four attempts, one request per 100 ms: at least 0.25 s from the first to the last
    assert len(seen) == 4
    assert seen[-1] - seen[0] >= 0.25


async def test_limits_hold_under_every_name_the_price_table_gives_the_model() -> None:
    limiter = ModelRateLimiter(
        {"gpt-4.1": ModelLimits(rpm=1, tpm=10_000, period_s=0.2)},
        default=None,
        resolve=load_price_table().resolve,
    )
    started = time.perf_counter()
    for name in ("gpt-4.1", "openai/gpt-4.1", "gpt-4.1-2025-04-14"):
        await limiter.acquire(name, 10)
    # (Other names went through at once.) One request per 0.2 s: the third waits ~0.4 s
    assert time.perf_counter() - started >= 0.3


def test_limits_are_kept_per_event_loop_so_threads_with_loops_of_their_own_can_share_a_client() -> None:
    # (One AsyncLimiter bound to the first loop: another thread's loop failed with "attached
    # to a different loop".)
    limiter = ModelRateLimiter({}, default=ModelLimits(rpm=2, tpm=10_000, period_s=0.1))

    async def burst() -> None:
        await asyncio.gather(*(limiter.acquire("m", 10) for _ in range(6)))

    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(burst())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == []


async def test_a_call_that_cannot_get_under_the_models_limits_within_the_request_timeout_sends_nothing() -> (
    None
):
    # Given one request a minute and a 0.3 s request timeout, and a call that took it: through
    # serve (FLOWLEDGER_LLM_RPM=1) a second step waited 60 s for its turn, its caller gone at
    # 20 s, and was then made and paid for (a third at 120 s), the lease renewed all along
    endpoint = Endpoint(200)
    limits = {"deepseek-v3.2": ModelLimits(rpm=1, tpm=100_000)}
    llm = client(endpoint, request_timeout_s=0.3, connect_timeout_s=0.3, limits=limits)
    await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    # When another call is made
    started = time.perf_counter()
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    # Then it fails once the request timeout has passed, having sent nothing: $0, priced,
    # saying when a request fits again (one a minute)
    assert time.perf_counter() - started < 2
    error = raised.value
    assert (error.error_type, error.attempts, endpoint.requests) == ("local_rate_limit", 0, 1)
    assert error.retry_after_s == 60.0
    assert "rpm 1" in str(error)
    assert error.usage is not None
    assert (error.usage.cost_usd, error.usage.unpriced, error.usage.attempts) == (0, False, 0)
    await llm.aclose()


async def test_a_retry_that_cannot_get_under_the_models_limits_in_time_ends_the_call() -> None:
    # Given a first attempt answered 503, and no room under the limits for its retry
    endpoint = Endpoint(503)
    limits = {"deepseek-v3.2": ModelLimits(rpm=1, tpm=100_000)}

    async def no_sleep(_: float) -> None:
        return None

    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        max_retries=2,
        request_timeout_s=0.3,
        connect_timeout_s=0.3,
        limits=limits,
    )
    llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(endpoint), retry_sleep=no_sleep
    )
    # When the call is made, Then it ends after the one attempt made
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="deepseek-v3.2", messages=MESSAGES)
    assert (raised.value.error_type, raised.value.attempts, endpoint.requests) == ("local_rate_limit", 1, 1)
    await llm.aclose()
