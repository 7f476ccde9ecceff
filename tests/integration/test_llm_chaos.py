"""The LLM client judged by an outside chaos server: llmock 0.2 (``llmock`` fixture, MIT).

llmock serves OpenAI's ``/v1/chat/completions`` on a real socket, breaks it on demand (HTTP
errors, Retry-After, outages, quotas, delays, streams dropped, cut, corrupted or stalled) and
grades the client from what it saw of every attempt and its timing: ``assert_resilient(strict=True)``
fails on any finding (retry_after_ignored, retried_non_retryable, retry_storm,
truncated_stream_accepted, no_backoff, gave_up, no_read_timeout, malformed_chunk_ignored).
Each test checks that verdict and our own records: the attempt log, the usage (``unpriced`` /
``billed_unreported`` when an attempt's usage is not known), the breaker, and for a few faults
the events ``Engine.process_step`` stores in a PostgreSQL schema of the test's own.

Real waits (llmock times them), kept short: Retry-After of 0.3 s, timeouts of 1 s, a fixed
jitter draw so that the backoff is the same on every run. docs/llm.md, "Judged by llmock".
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    OpenAICompatibleClient,
    load_price_table,
)
from flowledger.domain.errors import CircuitOpen, LlmCallFailed
from flowledger.domain.ports import LlmReply
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

MODEL = "gpt-4.1"
JITTER_DRAW = 0.4
"""The client's ``rand()``: every backoff is 0.5 s x 2**retry x (1 - 0.25 x 0.4), 0.45 s then 0.9 s."""

Factory = Callable[..., OpenAICompatibleClient]


@pytest.fixture
async def client_for(llmock: Any, llmock_server: Any) -> AsyncIterator[Factory]:
    """Clients pointed at llmock's OpenAI base URL (short timeouts); closed after the test.

    A retry waits what the policy says, then until llmock has recorded the attempts in flight
    (at most 2 s more): llmock takes a request for a retry only if the failed attempt had ended
    on its side first, and its server thread, in this process, lags behind on a busy machine.
    That only lengthens a wait, never shortens one; the attempt log keeps the policy's waits."""
    made: list[OpenAICompatibleClient] = []
    journal = llmock_server.state.journal

    async def retry_sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)
        for _ in range(200):
            if not journal.in_flight:
                return
            await asyncio.sleep(0.01)

    def make(**options: Any) -> OpenAICompatibleClient:
        options = {"request_timeout_s": 5.0, "connect_timeout_s": 1.0, "default_model": MODEL, **options}
        config = ClientConfig(
            base_url=llmock.base_url("openai"), api_key=ApiKey("sk-llmock-chaos"), **options
        )
        client = OpenAICompatibleClient(
            config, prices=load_price_table(), retry_sleep=retry_sleep, rand=lambda: JITTER_DRAW
        )
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


@pytest.fixture
async def engine_for(
    client_for: Factory, database_url: str, pg_schema: str
) -> AsyncIterator[Callable[..., Engine]]:
    """An Engine on PostgreSQL (the test's own schema) whose model is llmock."""
    made: list[Engine] = []

    def make(**options: Any) -> Engine:
        settings = make_settings(database_url=database_url, schema=pg_schema)
        engine = Engine(settings=settings, llm=client_for(**options))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.aclose()


def ask(text: str = "where is my order?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def outcomes(usage: LlmUsage | None) -> list[str]:
    assert usage is not None
    return [entry["outcome"] for entry in usage.extra["attempt_log"]]


def gaps(llmock: Any) -> list[float]:
    """How long the client waited between the end of one attempt and the start of the next."""
    records = llmock.requests
    return [after.started_at - before.ended_at for before, after in itertools.pairwise(records)]


def findings(llmock: Any) -> set[str]:
    return {finding.code for finding in llmock.verdict().findings}


STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


# -- HTTP errors: Retry-After, what is never retried, backoff, the breaker, storms ---------------


@STREAMED
async def test_a_429_with_retry_after_is_waited_for(llmock: Any, client_for: Factory, stream: bool) -> None:
    llmock.rate_limit(times=2, retry_after=0.3)
    reply = await client_for(stream=stream).complete(model=MODEL, messages=ask())

    assert reply.content
    assert outcomes(reply.usage) == ["http_429", "http_429", "ok"]
    assert [entry["waited_s"] for entry in reply.usage.extra["attempt_log"]] == [0.0, 0.3, 0.6]
    assert all(gap >= 0.3 for gap in gaps(llmock))
    assert not reply.usage.unpriced  # an HTTP error answer is not billed: the call stays priced
    llmock.assert_resilient(strict=True)


@STREAMED
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_client_error_is_never_retried(
    llmock: Any, client_for: Factory, status: int, stream: bool
) -> None:
    llmock.fail(status, times=None)
    client = client_for(stream=stream)
    with pytest.raises(LlmCallFailed) as failed:
        await client.complete(model=MODEL, messages=ask())

    # the chaos server's 404 names no model: the route's, not the model's (adapters/llm/not_found.py)
    assert failed.value.error_type == ("endpoint_not_found" if status == 404 else f"http_{status}")
    assert failed.value.attempts == 1
    assert failed.value.status_code == status
    assert len(llmock.requests) == 1
    assert client.breaker.failure_count == 0  # a 4xx says nothing about the endpoint's health
    llmock.assert_resilient(strict=True)


async def test_server_errors_back_off_exponentially_with_jitter(llmock: Any, client_for: Factory) -> None:
    llmock.outage(status=500)  # no Retry-After: the client's own backoff decides
    with pytest.raises(LlmCallFailed) as failed:
        await client_for().complete(model=MODEL, messages=ask())

    assert failed.value.error_type == "http_500"
    assert outcomes(failed.value.usage) == ["http_500"] * 3  # max_retries=2: three attempts, no more
    # Waited 0.45 s, then 0.9 s: the attempt log says so, and llmock saw no shorter gap.
    assert [entry["waited_s"] for entry in failed.value.usage.extra["attempt_log"]] == [0.0, 0.45, 1.35]
    first, second = gaps(llmock)
    assert first >= 0.45
    assert second >= 0.9
    llmock.assert_resilient(strict=True)  # no no_backoff, no gave_up, no retry_storm


async def test_an_outage_opens_the_breaker_and_no_request_goes_out_while_open(
    llmock: Any, client_for: Factory
) -> None:
    llmock.outage()  # 503 with llmock's default Retry-After (1 s)
    client = client_for(max_retries=1, breaker_failure_threshold=2, breaker_recovery_s=30.0)
    with pytest.raises(LlmCallFailed) as failed:
        await client.complete(model=MODEL, messages=ask())
    assert outcomes(failed.value.usage) == ["http_503", "http_503"]
    assert gaps(llmock)[0] >= 1.0  # the Retry-After of a 503 is honoured too
    assert client.breaker.state == "open"

    with pytest.raises(CircuitOpen):
        await client.complete(model=MODEL, messages=ask("and now?"))
    assert len(llmock.requests) == 2  # refused at once, without a request
    llmock.assert_resilient(strict=True)


async def test_concurrent_calls_in_an_outage_make_no_retry_storm(llmock: Any, client_for: Factory) -> None:
    llmock.outage(status=500)
    client = client_for(breaker_failure_threshold=5)
    calls = [client.complete(model=MODEL, messages=ask(f"call {n}")) for n in range(20)]
    results = await asyncio.gather(*calls, return_exceptions=True)

    assert all(isinstance(result, LlmCallFailed | CircuitOpen) for result in results)
    # The first attempts went out together; the breaker, open after them, refused the retries:
    # 20 requests (a few more if a retry came before the fifth failure was in), not the 60
    # that three attempts each would have made.
    assert 5 <= len(llmock.requests) <= 25
    verdict = llmock.verdict()
    assert verdict.passed  # no retry_storm, no retry before its time
    # llmock warns that a call "gave up" after one 500: the open breaker refused its retries,
    # on purpose (it fails fast so that an outage is not made worse).
    assert {finding.code for finding in verdict.warnings} <= {"gave_up"}


async def burst(client: OpenAICompatibleClient, model: str, label: str, calls: int = 61) -> list[LlmReply]:
    return await asyncio.gather(
        *(client.complete(model=model, messages=ask(f"{label}{n}")) for n in range(calls))
    )


async def test_a_server_quota_refusal_is_waited_for_as_long_as_it_says(
    llmock: Any, client_for: Factory
) -> None:
    # The client first opens its 61 connections (llmock unlimited), so that the burst that
    # counts reaches llmock at once, not as they open.
    client = client_for(request_timeout_s=5.0)
    await burst(client, "deepseek-v3.2", "warm")
    # A full bucket of 60, refilled at one request a second: the 61st of a burst is refused
    # only if the burst reaches llmock within that second, which a loaded machine (a CI run
    # beside other work) did not always do; so the burst is sent again, up to three times,
    # until one found the bucket empty, and whatever was refused is then judged.
    for _ in range(3):
        llmock.reset().limits(rpm=60)
        replies = await burst(client, MODEL, "q")
        refused = [record for record in llmock.requests if record.status == 429]
        if refused:
            break
    assert refused  # a request found the bucket empty and was told the true wait
    waited = [reply for reply in replies if outcomes(reply.usage)[0] == "http_429"]
    assert 1 <= len(waited) <= len(refused)  # a retry refused again is one more 429 of one call
    assert all(outcomes(reply.usage)[-1] == "ok" for reply in waited)
    llmock.assert_resilient(strict=True)  # waited as long as Retry-After asked


# -- slow answers and stalls: our timeouts --------------------------------------------------------


@STREAMED
async def test_a_slow_answer_within_the_timeout_is_waited_for(
    llmock: Any, client_for: Factory, stream: bool
) -> None:
    llmock.delay(0.4)
    reply = await client_for(stream=stream).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["ok"]
    assert reply.usage.latency_ms >= 400
    llmock.assert_resilient(strict=True)


@STREAMED
async def test_an_answer_past_the_timeout_is_given_up_and_retried(
    llmock: Any, client_for: Factory, stream: bool
) -> None:
    llmock.delay(2.0)
    reply = await client_for(stream=stream, request_timeout_s=1.0).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["timeout", "ok"]
    # The timed-out request had reached the provider, which may bill it: not a known $0.
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    llmock.assert_resilient(strict=True)


async def test_a_slow_first_token_is_measured(llmock: Any, client_for: Factory) -> None:
    llmock.slow_first_token(0.4)
    reply = await client_for(stream=True).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["ok"]
    assert reply.usage.extra["time_to_first_token_ms"] >= 400
    llmock.assert_resilient(strict=True)


async def test_a_stalled_stream_is_ended_by_our_timeout_and_retried(llmock: Any, client_for: Factory) -> None:
    llmock.stall(after_chunks=2, seconds=10.0)
    reply = await client_for(stream=True, request_timeout_s=1.0).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["timeout", "ok"]
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    stalled = llmock.requests[0]
    assert stalled.stall_waited is not None
    assert stalled.stall_waited < 5.0  # of the 10 s it would have lasted
    assert not stalled.completed  # we hung up; llmock did not get to finish the stream
    llmock.assert_resilient(strict=True)  # no no_read_timeout


async def test_without_a_read_timeout_a_stall_inside_the_deadline_is_sat_through(
    llmock: Any, client_for: Factory
) -> None:
    # The default: only the attempt's deadline (request_timeout_s, 60 s unless set) bounds a
    # stream, so a shorter stall is waited out; llmock warns.
    llmock.stall(after_chunks=2, seconds=1.2)
    reply = await client_for(stream=True, request_timeout_s=5.0).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["ok"]
    assert findings(llmock) == {"no_read_timeout"}


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_read_timeout_ends_a_stalled_stream_well_before_the_deadline(
    llmock: Any, client_for: Factory, transport: str
) -> None:
    llmock.stall(after_chunks=2, seconds=10.0)
    client = client_for(stream=True, request_timeout_s=8.0, read_timeout_s=1.0, transport=transport)
    reply = await client.complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["timeout", "ok"]
    assert reply.usage.extra["attempt_log"][0]["ms"] < 5000  # the deadline is 8 s, the stall 10 s
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    llmock.assert_resilient(strict=True)  # no no_read_timeout


# -- broken streams --------------------------------------------------------------------------------


async def test_a_dropped_stream_is_retried_and_its_cost_left_unknown(
    llmock: Any, client_for: Factory
) -> None:
    llmock.disconnect(after_chunks=3)
    reply = await client_for(stream=True).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["connection_error", "ok"]
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    assert reply.usage.extra["attempt_log"][0]["usage_reported"] is False
    llmock.assert_resilient(strict=True)


async def test_a_truncated_stream_is_never_taken_for_an_answer(llmock: Any, client_for: Factory) -> None:
    llmock.truncate(after_chunks=3)
    reply = await client_for(stream=True).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["connection_error", "ok"]  # no [DONE]: retried
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    llmock.assert_resilient(strict=True)  # no truncated_stream_accepted


async def test_a_corrupted_chunk_fails_the_attempt_and_is_retried(llmock: Any, client_for: Factory) -> None:
    # Paced: llmock counts the attempt as failed only if the client hangs up before the stream
    # ends; unpaced, a loaded machine let llmock write the whole short stream first (a CI run
    # then read our retry as a new call and the first as malformed_chunk_ignored).
    llmock.corrupt(after_chunks=3).pace(100)
    reply = await client_for(stream=True).complete(model=MODEL, messages=ask())
    assert outcomes(reply.usage) == ["malformed_response", "ok"]
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    llmock.assert_resilient(strict=True)  # no malformed_chunk_ignored


async def test_a_stream_corrupted_from_its_first_chunk_is_not_retried(
    llmock: Any, client_for: Factory
) -> None:
    # Nothing readable came: a proxy or endpoint that does not speak the format, which a retry
    # would only pay for again (as a 2xx JSON body that is not JSON).
    llmock.corrupt(after_chunks=0, times=None)
    with pytest.raises(LlmCallFailed) as failed:
        await client_for(stream=True).complete(model=MODEL, messages=ask())
    assert failed.value.error_type == "malformed_response"
    assert failed.value.attempts == 1
    assert findings(llmock) == {"malformed_chunk_ignored"}  # llmock would have retried; see docs/llm.md


@STREAMED
async def test_a_scripted_reply_is_read_whole(llmock: Any, client_for: Factory, stream: bool) -> None:
    text = '{"message": "Your order ships today.", "action": "order_status"}'
    llmock.reply(text)
    reply = await client_for(stream=stream).complete(model=MODEL, messages=ask())
    assert reply.content == text
    assert not reply.usage.unpriced
    assert reply.usage.input_tokens > 0
    assert reply.usage.output_tokens > 0
    llmock.assert_resilient(strict=True)


# -- through Engine.process_step, on PostgreSQL ----------------------------------------------------


def kinds(engine: Engine, session_id: str) -> list[str]:
    return [entry.event_type.rsplit(".", 1)[-1] for entry in engine.history(session_id)]


async def test_a_step_waits_out_a_rate_limit_and_records_every_attempt(
    llmock: Any, engine_for: Callable[..., Engine]
) -> None:
    llmock.rate_limit(times=2, retry_after=0.3)
    engine = engine_for(stream=True)
    engine.start_session("s1", "customer_service")
    record = await engine.process_step("s1", "classify_intent", {"message": "where is my order?"})

    stored = engine.get_session("s1").history[0]
    assert stored == record
    assert outcomes(stored.usage) == ["http_429", "http_429", "ok"]
    assert stored.usage is not None
    assert stored.usage.attempts == 3
    assert not stored.usage.unpriced
    assert kinds(engine, "s1") == ["Started", "StepStarted", "StepProcessed"]
    llmock.assert_resilient(strict=True)


async def test_a_step_refused_with_a_400_fails_at_once(
    llmock: Any, engine_for: Callable[..., Engine]
) -> None:
    llmock.fail(400, times=None)
    engine = engine_for()
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"}, idempotency_key="k1")

    (failure,) = engine.get_session("s1").failures
    assert failure.error_type == "http_400"
    assert failure.usage is not None
    assert failure.usage.attempts == 1
    assert kinds(engine, "s1") == ["Started", "StepStarted", "StepFailed"]
    assert len(llmock.requests) == 1
    llmock.assert_resilient(strict=True)


async def test_a_truncated_stream_is_never_recorded_as_a_processed_step(
    llmock: Any, engine_for: Callable[..., Engine]
) -> None:
    # Cut once: the retry answers, and the step's usage says a cut attempt was billed unknown.
    llmock.truncate(after_chunks=3)
    engine = engine_for(stream=True)
    engine.start_session("s1", "customer_service")
    await engine.process_step("s1", "classify_intent", {"message": "where is my order?"}, idempotency_key="a")
    (record,) = engine.get_session("s1").history
    assert outcomes(record.usage) == ["connection_error", "ok"]
    assert record.usage is not None
    assert record.usage.unpriced
    assert record.usage.billed_unreported
    llmock.assert_resilient(strict=True)

    # Cut every time: the step fails, with every attempt's cost unknown; never a StepProcessed.
    llmock.reset().truncate(after_chunks=3, times=None)
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "resolve", {"message": "and my refund?"}, idempotency_key="b")
    (failure,) = engine.get_session("s1").failures
    assert failure.error_type == "connection_error"
    assert outcomes(failure.usage) == ["connection_error"] * 3
    assert failure.usage is not None
    assert failure.usage.unpriced
    assert failure.usage.billed_unreported
    assert kinds(engine, "s1")[-2:] == ["StepStarted", "StepFailed"]
    # llmock judges a call by its last attempt: a truncated one reads as accepted, though ours
    # retried twice and failed the step (it cannot see the exception); see docs/llm.md.
    assert findings(llmock) == {"truncated_stream_accepted"}


async def test_a_corrupted_chunk_is_retried_before_the_step_is_recorded(
    llmock: Any, engine_for: Callable[..., Engine]
) -> None:
    llmock.corrupt(after_chunks=2).pace(100)  # paced: see the test of a corrupted chunk above
    engine = engine_for(stream=True)
    engine.start_session("s1", "customer_service")
    await engine.process_step("s1", "classify_intent", {"message": "where is my order?"})
    (record,) = engine.get_session("s1").history
    assert outcomes(record.usage) == ["malformed_response", "ok"]
    assert record.usage is not None
    assert record.usage.unpriced
    assert record.usage.billed_unreported
    llmock.assert_resilient(strict=True)


async def test_an_outage_fails_steps_then_the_open_breaker_fails_them_without_a_request(
    llmock: Any, engine_for: Callable[..., Engine]
) -> None:
    llmock.outage(status=502)
    engine = engine_for(max_retries=1, breaker_failure_threshold=2)
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"}, idempotency_key="a")
    with pytest.raises(CircuitOpen):
        await engine.process_step("s1", "resolve", {"message": "hello?"}, idempotency_key="b")

    failures = engine.get_session("s1").failures
    assert [f.error_type for f in failures] == ["http_502", "circuit_open"]
    assert outcomes(failures[0].usage) == ["http_502", "http_502"]
    assert len(llmock.requests) == 2
    llmock.assert_resilient(strict=True)
