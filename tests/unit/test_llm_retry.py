"""The client's retry policy, case by case, through the mock and both real transports (no sleeping)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.retry import backoff_s, parse_retry_after, status_is_retryable
from flowledger.domain.errors import LlmCallFailed
from tests.unit.test_llm_transports import Transports, path_of, transport_fixture  # noqa: F401 (a fixture)

Handler = Callable[[httpx.Request], Any]
OK_BODY = {
    "id": "chatcmpl-1",
    "model": "gpt-4.1-2025-04-14",
    "choices": [{"message": {"content": '{"message": "hi"}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5},
}
MESSAGES = [{"role": "user", "content": "hello"}]


def client(handler: Handler, waits: list[float], **options: Any) -> OpenAICompatibleClient:
    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), **options)
    return OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(handler),
        retry_sleep=no_sleep,
        rand=lambda: 0.0,
    )


async def served_client(
    transport: Transports, handler: Handler, waits: list[float], **options: Any
) -> OpenAICompatibleClient:
    """``client``, through the mock, aiohttp's transport or httpx's pool (the fixture's kind)."""

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    return await transport.client(handler, retry_sleep=no_sleep, rand=lambda: 0.0, **options)


def failing_then_ok(responses: list[httpx.Response]) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses.pop(0) if responses else httpx.Response(200, json=OK_BODY)

    return handler, seen


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_a_retryable_status_is_retried_and_the_success_records_two_attempts(
    status: int, transport: Transports
) -> None:
    handler, seen = failing_then_ok([httpx.Response(status, json={"error": {"message": "busy"}})])
    waits: list[float] = []
    async with await served_client(transport, handler, waits) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 2
    assert reply.usage.attempts == 2
    assert [a["outcome"] for a in reply.usage.extra["attempt_log"]] == [f"http_{status}", "ok"]
    assert waits == [0.5]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_client_error_is_not_retried(status: int, transport: Transports) -> None:
    handler, seen = failing_then_ok([httpx.Response(status, json={"error": {"message": "no"}})])
    async with await served_client(transport, handler, []) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    # a 404 whose body names no model is the route's, not the model's (adapters/llm/not_found.py)
    assert raised.value.error_type == ("endpoint_not_found" if status == 404 else f"http_{status}")
    assert raised.value.status_code == status
    assert raised.value.attempts == 1


async def test_x_should_retry_true_retries_even_a_client_error(transport: Transports) -> None:
    handler, seen = failing_then_ok([httpx.Response(400, headers={"x-should-retry": "true"})])
    async with await served_client(transport, handler, []) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 2
    assert reply.usage.attempts == 2


async def test_x_should_retry_false_stops_even_a_server_error(transport: Transports) -> None:
    handler, seen = failing_then_ok([httpx.Response(503, headers={"x-should-retry": "false"})])
    async with await served_client(transport, handler, []) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    assert raised.value.error_type == "http_503"


@pytest.mark.parametrize(
    ("headers", "expected_wait"),
    [
        ({"retry-after-ms": "250", "retry-after": "7"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "soon"}, 0.5),
        ({"retry-after": "0"}, 0.5),
    ],
)
async def test_the_wait_honours_retry_after_ms_then_retry_after(
    headers: dict[str, str], expected_wait: float, transport: Transports
) -> None:
    handler, _ = failing_then_ok([httpx.Response(429, headers=headers)])
    waits: list[float] = []
    async with await served_client(transport, handler, waits) as llm:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert waits == [expected_wait]


@pytest.mark.parametrize(
    ("headers", "expected_wait"),
    [
        ({"retry-after": "-inf"}, 0.5),
        ({"retry-after": "-5"}, 0.5),
        ({"retry-after": "inf"}, 0.5),
        ({"retry-after": "nan"}, 0.5),
        ({"retry-after-ms": "-inf"}, 0.5),
        ({"retry-after-ms": "inf"}, 0.5),
        ({"retry-after-ms": "-250", "retry-after": "2"}, 2.0),
        ({"retry-after-ms": "nan", "retry-after": "2"}, 2.0),
    ],
)
async def test_a_negative_or_non_finite_retry_after_is_ignored(
    headers: dict[str, str], expected_wait: float, transport: Transports
) -> None:
    # Given a retryable answer whose Retry-After is no wait at all
    handler, seen = failing_then_ok([httpx.Response(429, headers=headers)])
    waits: list[float] = []
    async with await served_client(transport, handler, waits) as llm:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then it is retried after the next header's wait, or the normal backoff
    assert (len(seen), waits) == (2, [expected_wait])


async def test_retry_after_as_an_http_date_is_honoured(transport: Transports) -> None:
    assert parse_retry_after({"retry-after": email.utils.formatdate(1_000_030)}, now=lambda: 1_000_000) == 30
    in_thirty = email.utils.formatdate(time.time() + 30, usegmt=True)
    handler, _ = failing_then_ok([httpx.Response(503, headers={"retry-after": in_thirty})])
    waits: list[float] = []
    async with await served_client(transport, handler, waits) as llm:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(waits) == 1
    assert 28 <= waits[0] <= 31


def test_retry_after_as_a_date_already_past_is_no_wait_not_a_negative_one() -> None:
    # It was read as -350,894,809.7 s (a date of 2015), and LlmCallFailed.retry_after_s, the
    # StepFailed's error_detail and a waiter's Retry-After carried that.
    past = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert parse_retry_after(past) == 0.0
    assert parse_retry_after({"retry-after": email.utils.formatdate(999_970)}, now=lambda: 1_000_000) == 0.0


async def test_a_refusal_with_a_past_date_fails_with_no_wait_after_the_normal_backoff(
    transport: Transports,
) -> None:
    past = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    handler, seen = failing_then_ok([httpx.Response(429, headers=past)] * 3)
    waits: list[float] = []
    async with await served_client(transport, handler, waits) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 3
    assert all(0.375 <= wait <= 1.0 for wait in waits)  # the backoff, as for no header
    assert raised.value.retry_after_s == 0.0


async def test_a_retry_after_beyond_two_minutes_is_not_retried(transport: Transports) -> None:
    handler, seen = failing_then_ok([httpx.Response(429, headers={"retry-after": "121"})])
    async with await served_client(transport, handler, []) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    assert raised.value.error_type == "http_429"
    assert status_is_retryable(429, {"retry-after": "120"}, 120.0)


def test_backoff_doubles_from_half_a_second_to_eight_with_up_to_a_quarter_jitter() -> None:
    assert [backoff_s(n, None, lambda: 0.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert [backoff_s(n, None, lambda: 1.0) for n in range(5)] == [0.375, 0.75, 1.5, 3.0, 6.0]


async def test_retries_are_bounded_and_the_error_says_how_many_attempts_were_made(
    transport: Transports,
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503, json={"error": {"message": "down"}})

    waits: list[float] = []
    async with await served_client(transport, handler, waits, max_retries=3) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 4
    assert waits == [0.5, 1.0, 2.0]
    error = raised.value
    assert (error.attempts, error.status_code, error.error_type) == (4, 503, "http_503")
    assert error.usage is not None
    assert error.usage.attempts == 4
    assert error.usage.cost_usd == 0
    assert [a["outcome"] for a in error.usage.extra["attempt_log"]] == ["http_503"] * 4


@pytest.mark.parametrize(
    ("exception", "error_type"),
    [
        (httpx.ConnectError("refused"), "connection_error"),
        (httpx.RemoteProtocolError("peer closed"), "connection_error"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.ConnectTimeout("slow"), "timeout"),
    ],
)
async def test_timeouts_and_connection_errors_are_retried(exception: Exception, error_type: str) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise exception
        return httpx.Response(200, json=OK_BODY)

    async with client(handler, []) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert reply.usage.extra["attempt_log"][0]["outcome"] == error_type
    assert reply.usage.attempts == 2


async def test_an_attempt_is_cut_off_at_the_total_request_timeout(transport: Transports) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=OK_BODY)

    async with await served_client(
        transport, handler, [], request_timeout_s=0.05, connect_timeout_s=0.05, max_retries=1
    ) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert (raised.value.error_type, raised.value.attempts) == ("timeout", 2)


async def test_a_2xx_body_that_is_not_json_is_not_retried(transport: Transports) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b'{"id": "x", "choi')

    async with await served_client(transport, handler, []) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    assert raised.value.error_type == "malformed_response"


GOOD_CHUNK = b'data: {"id": "c", "choices": [{"delta": {"role": "assistant", "content": "{"}}]}\n\n'
CUT_CHUNK = b'data: {"id": "c", "choices": [{"delta": {"cont\n\n'
LAST_CHUNKS = (
    b'data: {"id": "c", "choices": [{"delta": {"content": "}"}, "finish_reason": "stop"}]}\n\n'
    b'data: {"id": "c", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    "corrupted",
    [GOOD_CHUNK + CUT_CHUNK + LAST_CHUNKS, GOOD_CHUNK + b"data: [1, 2]\n\n" + LAST_CHUNKS],
    ids=["not JSON", "not an object"],
)
async def test_a_stream_corrupted_after_a_good_chunk_is_retried(
    transport: Transports, corrupted: bytes
) -> None:
    # A stream that began well and then sent a chunk it cannot read broke in transit, as one
    # cut before [DONE]: the attempt fails and is retried (llmock's ``malformed_chunk_ignored``:
    # it was failed without a retry). Its cost is not known: the provider had the prompt.
    bodies = [corrupted, GOOD_CHUNK + LAST_CHUNKS]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=bodies.pop(0), headers={"content-type": "text/event-stream"})

    waits: list[float] = []
    async with await served_client(transport, handler, waits, stream=True) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 2
    assert reply.content == "{}"
    assert [a["outcome"] for a in reply.usage.extra["attempt_log"]] == ["malformed_response", "ok"]
    assert reply.usage.unpriced
    assert reply.usage.billed_unreported
    assert waits == [0.5]


async def test_a_stream_whose_first_chunk_cannot_be_read_is_not_retried(transport: Transports) -> None:
    # Nothing readable came: an endpoint (or a proxy) that does not send this format, which a
    # retry would only pay for again, as a 2xx JSON body that is not JSON.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, content=CUT_CHUNK + LAST_CHUNKS, headers={"content-type": "text/event-stream"}
        )

    async with await served_client(transport, handler, [], stream=True) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    assert raised.value.error_type == "malformed_response"


@pytest.mark.parametrize(
    ("content", "billed"),
    [
        # A body nested past what a parser takes (200,000 levels)
        (b"[" * 200_000 + b"]" * 200_000, 0),
        (
            b'{"choices": [{"message": {"content": "x"}}], "usage": '
            + b"[" * 200_000
            + b"]" * 200_000
            + b"}",
            0,
        ),
    ],
)
async def test_a_2xx_body_the_client_cannot_read_is_a_malformed_response_not_a_crash(
    transport: Transports, content: bytes, billed: int
) -> None:
    # (It raised RecursionError, recorded as a bare exception name, without usage.)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=content)

    async with await served_client(transport, handler, []) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert len(seen) == 1
    assert raised.value.error_type == "malformed_response"
    assert raised.value.usage is not None
    assert raised.value.usage.input_tokens == billed


async def test_a_choice_that_is_not_an_object_after_the_first_is_ignored(transport: Transports) -> None:
    # (It raised AttributeError: the reply's billed usage was lost, the step failed unclassified.)
    content = b'{"choices": [{"message": {"content": "x"}}, "junk"], "usage": {"prompt_tokens": 7}}'
    async with await served_client(
        transport, lambda request: httpx.Response(200, content=content), []
    ) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert (reply.content, reply.usage.input_tokens) == ("x", 7)


async def test_the_request_asks_for_json_with_explicit_limits(transport: Transports) -> None:
    handler, seen = failing_then_ok([])
    async with await served_client(transport, handler, [], max_tokens=256) as llm:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    body = json.loads(seen[0].content)
    assert body["response_format"] == {"type": "json_object"}
    assert body["max_tokens"] == 256
    assert path_of(seen[0]) == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("status", "headers", "retry_after_s"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (503, {"retry-after-ms": "2500", "retry-after": "9"}, 2.5),
        (429, {"retry-after": "600"}, 600.0),  # past the cap: not retried, but still said
        (429, {}, None),
        (503, {"retry-after": "soon"}, None),
        (500, {"retry-after": "7"}, None),  # only a refusal's Retry-After says when to come back
    ],
)
async def test_a_call_refused_to_the_end_keeps_the_wait_its_last_refusal_asked_for(
    status: int, headers: dict[str, str], retry_after_s: float | None, transport: Transports
) -> None:
    # Given an endpoint that refuses every attempt, saying (or not) when to come back
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, json={"error": {"message": "slow down"}})

    # When its retries run out
    async with await served_client(transport, handler, [], max_retries=1) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)

    # Then the error keeps the last refusal's wait, for the caller to pass on
    assert raised.value.status_code == status
    assert raised.value.retry_after_s == retry_after_s


async def test_the_wait_is_the_last_attempts_not_an_earlier_ones() -> None:
    # Given an endpoint that asks to wait once, then fails without saying when to come back
    handler, _ = failing_then_ok(
        [
            httpx.Response(429, headers={"retry-after": "3"}),
            httpx.Response(503, json={"error": {"message": "down"}}),
        ]
    )
    # When the retries run out on the second
    async with client(handler, [], max_retries=1) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then no wait is kept: the last refusal did not ask for one
    assert raised.value.retry_after_s is None
