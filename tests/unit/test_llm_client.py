"""The client's reading of replies, its usage and cost, streaming, and how it guards the API key."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    OpenAICompatibleClient,
    build_engine,
    load_price_table,
)
from flowledger.adapters.llm.completion import estimate_prompt_tokens
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.errors import LlmCallFailed, UnknownModelPrice, ValidationError
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Settings
from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

SECRET = "sk-live-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "where is my order?"}]


def body(**usage: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-42",
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"message": {"content": '{"action": "x"}'}, "finish_reason": "stop"}],
        "usage": usage,
    }


async def client(transport: Transports, handler: Any, **options: Any) -> OpenAICompatibleClient:
    """A client whose requests reach ``handler`` through the fixture's kind of transport."""
    return await transport.client(handler, api_key=ApiKey(SECRET), **options)


async def test_usage_is_read_per_token_type_and_priced_exactly(transport: Transports) -> None:
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1000},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    async with await client(transport, lambda request: httpx.Response(200, json=body(**usage))) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    u = reply.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (1200, 300, 1000)
    assert (u.request_model, u.response_model, u.response_id) == (
        "gpt-4.1",
        "gpt-4.1-2025-04-14",
        "chatcmpl-42",
    )
    assert u.finish_reasons == ("stop",)
    # 200 x $2/M + 1,000 x $0.50/M + 300 x $8/M
    assert u.cost_usd == Decimal("0.0033")
    assert u.price_version == load_price_table().version
    assert u.latency_ms >= 0
    assert u.attempts == 1
    assert reply.content == '{"action": "x"}'


@pytest.mark.parametrize(
    ("served", "cost", "priced_as"),
    [
        # 1,000 x $3/M + 100 x $15/M: the model that ran, as a router or a fallback bills it
        ("anthropic/claude-sonnet-4.5", Decimal("0.0045"), "claude-sonnet-4.5"),
        # 1,000 x $2/M + 100 x $8/M: a dated release of the model asked for is that model
        ("gpt-4.1-2025-04-14", Decimal("0.0028"), None),
        # a model the table does not know: the price asked for, its name kept
        ("someone-elses-model", Decimal("0.0028"), None),
    ],
    ids=["another-priced-model", "a-dated-release", "an-unknown-model"],
)
async def test_a_reply_naming_another_model_is_priced_as_the_model_that_answered(
    transport: Transports, served: str, cost: Decimal, priced_as: str | None
) -> None:
    # (An outside probe: a reply naming another model was priced at the model asked for.)
    reply_body = {**body(prompt_tokens=1000, completion_tokens=100), "model": served}
    async with await client(transport, lambda request: httpx.Response(200, json=reply_body)) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    usage = reply.usage
    assert (usage.request_model, usage.response_model) == ("gpt-4.1", served)
    assert usage.cost_usd == cost
    assert usage.extra.get("priced_as") == priced_as
    assert not usage.unpriced


async def test_the_api_key_goes_only_into_the_authorization_header(transport: Transports) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(200, json=body(prompt_tokens=3, completion_tokens=2))
        return httpx.Response(401, json={"error": {"message": f"Incorrect API key provided: {SECRET}"}})

    llm = await client(transport, handler)
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert seen[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in json.dumps(reply.usage.to_dict())
    assert SECRET not in str(raised.value)
    assert SECRET not in repr(llm)
    assert SECRET not in repr(llm.config)


@pytest.mark.parametrize("bad", ["", "short", "has space in it", "'sk-quoted-key'", "sk-key\nnewline"])
def test_a_malformed_api_key_is_rejected_at_start_up(bad: str) -> None:
    with pytest.raises(ValidationError) as raised:
        ApiKey(bad)
    assert raised.value.field == "llm_api_key"


def test_an_engine_cannot_be_built_without_base_url_or_key() -> None:
    with pytest.raises(ValidationError, match="FLOWLEDGER_LLM_BASE_URL"):
        build_engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")))
    with pytest.raises(ValidationError, match="FLOWLEDGER_LLM_API_KEY"):
        build_engine(
            settings=Settings(database_url="memory:", home=Path("/nonexistent"), llm_base_url="http://x/v1")
        )


async def test_timeouts_and_the_sharded_httpx_pool_limits_are_explicit() -> None:
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey(SECRET),
        connect_timeout_s=2.0,
        request_timeout_s=20.0,
        max_connections=7,
        max_keepalive_connections=3,
        transport="httpx",
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    timeout = llm._pool().http.timeout
    assert (timeout.connect, timeout.read) == (2.0, 20.0)
    pools = [shard._pool for shard in llm._pool().http._transport.pools]  # type: ignore[attr-defined]
    assert sum(p._max_connections for p in pools) >= 7
    assert sum(p._max_keepalive_connections for p in pools) >= 3
    assert all(p._max_connections <= config.pool_shard_size for p in pools)
    await llm.aclose()
    with pytest.raises(ValidationError):
        ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey(SECRET), connect_timeout_s=0)


async def test_a_read_timeout_bounds_a_stream_between_reads_and_not_a_whole_reply() -> None:
    # llmock's ``no_read_timeout``: a stream that stalled was waited out up to the attempt's
    # deadline (60 s by default); ``read_timeout_s`` ends it sooner (test_llm_chaos.py).
    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey(SECRET), request_timeout_s=30.0, read_timeout_s=4.0
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    assert llm._pool().http.timeout.read == 4.0  # streams (and GET /models)
    assert llm._timeout["read"] == 30.0  # a reply that is not streamed comes whole, at the end
    await llm.aclose()
    default = OpenAICompatibleClient(
        ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey(SECRET), request_timeout_s=30.0),
        prices=load_price_table(),
    )
    assert default._pool().http.timeout.read == 30.0
    await default.aclose()
    for bad in (0.0, -1.0, 31.0):
        with pytest.raises(ValidationError, match="read_timeout_s"):
            ClientConfig(
                base_url="https://llm.test/v1",
                api_key=ApiKey(SECRET),
                request_timeout_s=30.0,
                read_timeout_s=bad,
            )


async def test_an_unknown_model_fails_before_any_request_is_sent(transport: Transports) -> None:
    seen: list[httpx.Request] = []
    async with await client(transport, lambda r: seen.append(r) or httpx.Response(200, json=body())) as llm:
        with pytest.raises(UnknownModelPrice) as raised:
            await llm.complete(model="mystery-model", messages=MESSAGES)
    assert seen == []
    assert raised.value.error_type == "unknown_model_price"


def sse(*chunks: dict[str, Any]) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
async def test_a_streamed_text_with_a_unicode_line_separator_is_one_event(
    transport: Transports, separator: str
) -> None:
    # SSE lines end only at CR or LF; httpx's aiter_lines also split at U+2028, U+0085 and the
    # like (str.splitlines), so a model's reply holding one raw broke its chunk in two, and the
    # step failed as malformed_response. JSON may carry them raw (ensure_ascii=False).
    text = f"first{separator}second"
    chunk = {"id": "c", "choices": [{"delta": {"content": text}, "finish_reason": "stop"}]}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    body = (
        "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in (chunk, usage)) + "data: [DONE]\n\n"
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    async with await client(transport, handler) as llm:
        reply = await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
    assert reply.content == text
    assert reply.usage.input_tokens == 4


def _event_streams() -> dict[str, str]:
    """One answer (its text in two chunks, a finish reason, usage) written as the SSE spec
    allows, each read whole by the OpenAI SDK's decoder."""
    chunks = [
        {"id": "c", "choices": [{"delta": {"content": '{"action": '}}]},
        {"id": "c", "choices": [{"delta": {"content": '"x"}'}, "finish_reason": "stop"}]},
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ]
    texts = [json.dumps(chunk) for chunk in chunks]
    return {
        # an event's data over several data: lines, joined by line breaks
        "data over lines": "".join("data: " + text.replace(', "', ',\ndata: "') + "\n\n" for text in texts)
        + "data: [DONE]\n\n",
        # a byte-order mark before the first line, which the spec's decoding drops
        "byte-order mark": "\ufeff" + "".join(f"data: {text}\n\n" for text in texts) + "data: [DONE]\n\n",
    }


@pytest.mark.parametrize("written", list(_event_streams()))
async def test_an_event_stream_written_as_the_sse_spec_allows_is_read_whole(
    transport: Transports, written: str
) -> None:
    # Data over lines failed the paid answer as malformed_response ("stream chunk is not JSON",
    # not retried); after a byte-order mark the first chunk's text was dropped without a word
    # (the step recorded as "the reply has no text").
    body = _event_streams()[written].encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with await client(transport, handler) as llm:
        reply = await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
    assert reply.content == '{"action": "x"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.attempts) == (4, 2, 1)
    assert reply.usage.finish_reasons == ("stop",)


async def test_a_streamed_reply_is_assembled_with_usage_and_time_to_first_token(
    transport: Transports,
) -> None:
    seen: list[httpx.Request] = []
    base = {"id": "chatcmpl-s", "model": "gemini-2.5-flash"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        content = sse(
            {**base, "choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {**base, "choices": [{"delta": {"content": '{"message": '}}]},
            {**base, "choices": [{"delta": {"content": '"hi"}'}, "finish_reason": "stop"}]},
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": 40,
                    "completion_tokens": 70,
                    "completion_tokens_details": {"reasoning_tokens": 60},
                },
            },
        )
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    async with await client(transport, handler) as llm:
        reply = await llm.complete_streaming(model="gemini-2.5-flash", messages=MESSAGES)
    sent = json.loads(seen[0].content)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert reply.content == '{"message": "hi"}'
    u = reply.usage
    assert (u.input_tokens, u.output_tokens, u.reasoning_output_tokens) == (40, 70, 60)
    assert u.finish_reasons == ("stop",)
    assert u.extra["streamed"] is True
    assert 0 <= u.extra["time_to_first_token_ms"] <= u.latency_ms
    # 40 x $0.30/M + 10 x $2.50/M + 60 reasoning x $2.50/M
    assert u.cost_usd == Decimal("0.000187")


async def test_a_stream_cut_before_done_is_a_retryable_connection_error() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, content=b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')

    async def no_sleep(_: float) -> None:
        return None

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey(SECRET), max_retries=1)
    llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=no_sleep
    )
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert (raised.value.error_type, len(calls)) == ("connection_error", 2)


@pytest.mark.parametrize(
    ("last", "whole"),
    [
        ("usage", True),  # finished and billed: the stream is whole, [DONE] or not
        ("finish", False),  # the usage chunk may still have been coming
        ("content", False),  # cut mid-answer (llmock's truncate)
    ],
)
async def test_a_stream_ended_without_done_is_whole_only_after_its_finish_and_usage(
    transport: Transports, last: str, whole: bool
) -> None:
    # Given an endpoint whose stream ends cleanly without "data: [DONE]" (the OpenAI SDK stops
    # at the body's end): it was retried as cut, every attempt billed, and the step failed
    chunks: list[dict[str, Any]] = [
        {"id": "c", "model": "gpt-4.1", "choices": [{"delta": {"content": '{"message": "hi"}'}}]},
        {"id": "c", "model": "gpt-4.1", "choices": [{"delta": {}, "finish_reason": "stop"}]},
        {
            "id": "c",
            "model": "gpt-4.1",
            "choices": [],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 100},
        },
    ]
    sent = chunks[: {"content": 1, "finish": 2, "usage": 3}[last]]
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        content = "".join(f"data: {json.dumps(c)}\n\n" for c in sent).encode()
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    async def no_sleep(_: float) -> None:
        return None

    async with await client(transport, handler, max_retries=1, retry_sleep=no_sleep) as llm:
        if whole:
            # Then a finished, billed stream is the answer, priced once: 1,000 x $2/M + 100 x $8/M
            reply = await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
            assert (reply.content, reply.usage.cost_usd, len(calls)) == (
                '{"message": "hi"}',
                Decimal("0.0028"),
                1,
            )
            assert reply.usage.finish_reasons == ("stop",)
        else:
            # And one that may have been cut is retried, as before
            with pytest.raises(LlmCallFailed) as raised:
                await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
            assert (raised.value.error_type, len(calls)) == ("connection_error", 2)


async def test_verify_reports_a_rejected_key(transport: Transports) -> None:
    async with await client(transport, lambda r: httpx.Response(401, json={"error": "no"})) as llm:
        with pytest.raises(ValidationError) as raised:
            await llm.verify()
    assert raised.value.field == "llm_api_key"
    listing = {"data": [{"id": "gpt-4.1"}, {"id": "deepseek-v3.2"}]}
    async with await client(transport, lambda r: httpx.Response(200, json=listing)) as llm:
        assert await llm.verify() == ["gpt-4.1", "deepseek-v3.2"]


@pytest.mark.parametrize(
    "content",
    [
        b"<html>not json</html>",
        b"[1, 2]",
        b'{"data": null}',
        b'{"data": 5}',
        b"[" * 100_000,
        b'{"data": [' + b'{"id": "m"}, ' * 100_000 + b'{"id": "z"}]}',
    ],
    ids=[
        "not JSON",
        "a list",
        "data null",
        "data a number",
        "nested past the parser",
        "past max_reply_bytes",
    ],
)
async def test_verify_refuses_a_models_answer_that_is_not_a_model_list(
    transport: Transports, content: bytes
) -> None:
    # A 200 whose body was not a model list escaped verify() as JSONDecodeError,
    # AttributeError, TypeError or RecursionError, and a body of any size was read whole.
    reply = httpx.Response(200, content=content, headers={"content-type": "application/json"})
    async with await client(transport, lambda r: reply, max_reply_bytes=1024 * 1024) as llm:
        with pytest.raises(ValidationError) as raised:
            await llm.verify()
    assert raised.value.field == "llm_base_url"
    assert "GET /models" in raised.value.message


STREAM_HEAD = [
    {"id": "c1", "model": "gpt-4.1", "choices": [{"delta": {"content": '{"message": "hi"}'}}]},
    {
        "id": "c1",
        "model": "gpt-4.1",
        "choices": [],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100},
    },
]
"""A stream's content and its usage chunk (billed: 1,000 x $2/M + 100 x $8/M = $0.0028), before [DONE]."""


def stream_then(
    ending: str, sent: asyncio.Event | None = None, head: list[dict[str, Any]] = STREAM_HEAD
) -> Any:
    """A handler whose first stream sends ``head`` (``STREAM_HEAD`` unless told) and then is
    cut (``"drop"``) or hangs (``"hang"``); later requests get a whole stream."""
    requests: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(1)
        if len(requests) > 1:
            return httpx.Response(200, content=sse(*STREAM_HEAD))

        async def body() -> Any:
            for chunk in head:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            if sent is not None:
                sent.set()
            if ending == "drop":
                raise httpx.ReadError("connection reset by peer")
            await asyncio.sleep(30)

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return handler


def mock_client(handler: Any, **options: Any) -> OpenAICompatibleClient:
    async def no_sleep(_: float) -> None:
        return None

    options = {"stream": True, **options}
    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey(SECRET), **options)
    return OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=no_sleep
    )


@pytest.mark.parametrize("ending", ["drop", "hang"])
async def test_a_stream_cut_or_timed_out_after_its_usage_chunk_keeps_what_it_was_billed(ending: str) -> None:
    # (The attempt was logged without usage, so the retry's answer carried retried_cost_usd 0.)
    llm = mock_client(stream_then(ending), request_timeout_s=0.5, connect_timeout_s=0.5)
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    first = reply.usage.extra["attempt_log"][0]
    assert first["outcome"] == ("connection_error" if ending == "drop" else "timeout")
    assert first["usage"]["input_tokens"] == 1000
    assert reply.usage.retried_cost_usd == Decimal("0.0028")
    assert reply.usage.charged_usd == Decimal("0.0056")


async def cancelled_mid_stream(head: list[dict[str, Any]]) -> LlmUsage:
    """The usage on the CancelledError of a call cancelled while its stream, having sent
    ``head``, hangs."""
    sent = asyncio.Event()
    llm = mock_client(stream_then("hang", sent, head=head))
    call = asyncio.ensure_future(llm.complete(model="gpt-4.1", messages=MESSAGES))
    await asyncio.wait_for(sent.wait(), 5)
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError) as raised:
        await call
    await llm.aclose()
    usage = raised.value.usage  # type: ignore[attr-defined]
    assert isinstance(usage, LlmUsage)
    return usage


async def test_a_stream_cancelled_after_its_usage_chunk_carries_what_it_was_billed() -> None:
    usage = await cancelled_mid_stream(STREAM_HEAD)
    assert usage.extra["attempt_log"][0]["outcome"] == "cancelled"
    assert usage.charged_usd == Decimal("0.0028")


CONTENT_ONLY = STREAM_HEAD[:1]
"""A stream's content without its usage chunk: the provider bills it, but has not said for what."""


@pytest.mark.parametrize("ending", ["drop", "hang"])
async def test_a_stream_cut_or_timed_out_before_its_usage_chunk_is_unpriced_not_free(ending: str) -> None:
    # Given a stream the provider began answering, cut or timed out before its usage chunk
    llm = mock_client(
        stream_then(ending, head=CONTENT_ONLY), request_timeout_s=0.5, connect_timeout_s=0.5, max_retries=0
    )
    # When the call fails on it
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then what it cost is not known (it was billed: never a silent $0), and what is known is kept
    usage = raised.value.usage
    assert usage is not None
    assert (usage.unpriced, usage.request_model, usage.charged_usd) == (True, "gpt-4.1", Decimal(0))
    assert usage.input_tokens == usage.output_tokens == 0  # no counts made up
    assert usage.extra["usage_reported"] is False
    assert usage.extra["estimated_prompt_tokens"] == estimate_prompt_tokens(MESSAGES)
    [cut] = usage.extra["attempt_log"]
    assert cut["outcome"] == ("connection_error" if ending == "drop" else "timeout")
    assert (cut["cost_usd"], cut["usage_reported"]) == (None, False)
    assert cut["streamed_chars"] == len('{"message": "hi"}')
    assert "usage" not in cut


async def test_an_answer_after_a_stream_cut_before_its_usage_chunk_is_unpriced() -> None:
    # Given a first stream cut before its usage chunk, and a retry that answers in full
    llm = mock_client(stream_then("drop", head=CONTENT_ONLY))
    # When the call succeeds on the retry
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then the answer is priced, but the call's cost is not known: the cut attempt was billed too
    usage = reply.usage
    assert usage.unpriced is True
    assert (usage.cost_usd, usage.retried_cost_usd) == (Decimal("0.0028"), Decimal(0))
    first, answer = usage.extra["attempt_log"]
    assert (first["outcome"], first["cost_usd"], first["usage_reported"]) == ("connection_error", None, False)
    assert Decimal(answer["cost_usd"]) == Decimal("0.0028")
    assert "usage_reported" not in usage.extra  # the answer's own usage was reported


async def test_a_stream_cancelled_before_its_usage_chunk_is_unpriced_not_free() -> None:
    # Given a stream the provider began answering, and its caller cancelled before the usage chunk
    usage = await cancelled_mid_stream(CONTENT_ONLY)
    # Then the usage on the error says its cost is not known, not that it was free
    assert (usage.unpriced, usage.request_model, usage.charged_usd) == (True, "gpt-4.1", Decimal(0))
    [cancelled] = usage.extra["attempt_log"]
    assert (cancelled["outcome"], cancelled["cost_usd"], cancelled["usage_reported"]) == (
        "cancelled",
        None,
        False,
    )
    assert cancelled["streamed_chars"] == len('{"message": "hi"}')


@pytest.mark.parametrize("refusal", ["connect_error", "http_503"])
async def test_a_stream_that_never_began_was_not_billed_and_stays_priced(refusal: str) -> None:
    # Given an endpoint that refuses the stream before it begins
    def handler(request: httpx.Request) -> httpx.Response:
        if refusal == "connect_error":
            raise httpx.ConnectError("connection refused")
        return httpx.Response(503, json={"error": "overloaded"})

    llm = mock_client(handler, max_retries=0)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then nothing was billed: $0, and known to be $0
    usage = raised.value.usage
    assert usage is not None
    assert (usage.unpriced, usage.charged_usd) == (False, Decimal(0))
    assert "usage_reported" not in usage.extra["attempt_log"][0]


def error_in_stream(error: Any, *before: dict[str, Any]) -> bytes:
    """A stream that begins (a role chunk, then ``before``), sends ``error`` in a chunk, then [DONE]."""
    role = {"id": "c1", "model": "gpt-4.1", "choices": [{"delta": {"role": "assistant", "content": ""}}]}
    return sse(role, *before, {"error": error})


@pytest.mark.parametrize(
    ("error", "outcome", "requests", "endpoint_failures"),
    [
        ({"message": "The server had an error", "type": "server_error"}, "stream_server_error", 3, 3),
        ({"message": "Overloaded", "type": "overloaded_error"}, "stream_server_error", 3, 3),
        # OpenRouter: the status as a number in code
        ({"message": "Provider returned error", "code": 502}, "stream_server_error", 3, 3),
        ({"code": "server_error", "message": "Provider disconnected"}, "stream_server_error", 3, 3),
        ({"message": "slow", "type": "requests", "code": "rate_limit_exceeded"}, "stream_rate_limited", 3, 0),
        # LiteLLM: the status as a string in code
        ({"message": "slow down", "type": None, "code": "429"}, "stream_rate_limited", 3, 0),
        ({"message": "bad parameter", "type": "invalid_request_error"}, "stream_request_error", 1, 0),
        ("something broke", "stream_server_error", 3, 3),
    ],
)
async def test_an_error_inside_a_stream_fails_the_attempt_as_its_http_equivalent_would(
    error: Any, outcome: str, requests: int, endpoint_failures: int
) -> None:
    # Given a stream that begins, then says it failed
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        content = error_in_stream(error)
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    llm = mock_client(handler)
    # When the call is made, it fails (retried as the same error over HTTP would be), not an empty answer
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert (raised.value.error_type, len(seen)) == (outcome, requests)
    assert llm.breaker.failure_count == endpoint_failures
    # Then each attempt began (the provider took the prompt) without saying what it used: unpriced
    usage = raised.value.usage
    assert usage is not None
    assert usage.unpriced is True
    assert [entry["outcome"] for entry in usage.extra["attempt_log"]] == [outcome] * requests
    assert all(entry["usage_reported"] is False for entry in usage.extra["attempt_log"])


async def test_an_error_inside_a_stream_keeps_the_usage_read_before_it() -> None:
    usage_chunk = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 100}}

    def handler(request: httpx.Request) -> httpx.Response:
        content = error_in_stream({"message": "bad", "type": "invalid_request_error"}, usage_chunk)
        return httpx.Response(200, content=content)

    llm = mock_client(handler)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    usage = raised.value.usage
    assert usage is not None
    assert raised.value.error_type == "stream_request_error"
    assert (usage.input_tokens, usage.charged_usd, usage.unpriced) == (1000, Decimal("0.0028"), False)


async def test_an_answer_after_an_error_inside_a_stream_is_taken() -> None:
    replies = iter(
        [
            httpx.Response(200, content=error_in_stream({"message": "busy", "type": "server_error"})),
            httpx.Response(200, content=sse(*STREAM_HEAD)),
        ]
    )
    llm = mock_client(lambda request: next(replies))
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert reply.content == '{"message": "hi"}'
    assert [entry["outcome"] for entry in reply.usage.extra["attempt_log"]] == ["stream_server_error", "ok"]


async def test_a_stream_answered_with_a_whole_json_completion_is_read_as_one(transport: Transports) -> None:
    # Given a proxy that ignores "stream": true and answers with the whole completion
    seen: list[httpx.Request] = []
    usage = {"prompt_tokens": 1000, "completion_tokens": 100}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {"content-type": "application/json; charset=utf-8"}
        return httpx.Response(200, content=json.dumps(body(**usage)).encode(), headers=headers)

    async with await client(transport, handler, stream=True) as llm:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then it is the answer, priced at its usage: one request, not a retried "stream cut"
    assert json.loads(seen[0].content)["stream"] is True
    assert reply.content == '{"action": "x"}'
    u = reply.usage
    assert (len(seen), u.attempts, u.input_tokens, u.output_tokens) == (1, 1, 1000, 100)
    assert (u.cost_usd, u.unpriced, u.finish_reasons) == (Decimal("0.0028"), False, ("stop",))
    assert [entry["outcome"] for entry in u.extra["attempt_log"]] == ["ok"]
    assert u.extra["time_to_first_token_ms"] is not None


@pytest.mark.parametrize(
    ("text", "input_tokens", "unpriced"),
    [
        (json.dumps({"id": "r", "usage": {"prompt_tokens": 1000, "completion_tokens": 100}}), 1000, False),
        ("{not json", 0, True),
    ],
    ids=["a body without choices", "a body that is not JSON"],
)
async def test_a_stream_answered_with_json_that_is_no_completion_is_a_malformed_response(
    text: str, input_tokens: int, unpriced: bool
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})

    llm = mock_client(handler)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Not retried; it keeps the usage it names, and one that names none was billed for what is not known
    usage = raised.value.usage
    assert usage is not None
    assert (raised.value.error_type, len(seen)) == ("malformed_response", 1)
    assert (usage.input_tokens, usage.unpriced) == (input_tokens, unpriced)


@pytest.mark.parametrize(
    ("text", "input_tokens", "unpriced"),
    [
        (json.dumps({"id": "r", "usage": {"prompt_tokens": 1000, "completion_tokens": 100}}), 1000, False),
        ('{"id": "chatcmpl-1", "choices": [{"mess', 0, True),
        # (a page, "<html>...", is not the endpoint's: test_llm_transports, retried)
        ("upstream hiccup", 0, True),
        (json.dumps({"id": "r", "choices": []}), 0, True),
    ],
    ids=["a body without choices", "a body cut short", "a body that is not JSON", "no choices, no usage"],
)
async def test_a_2xx_that_is_no_completion_is_billed_for_what_it_does_not_say_as_a_stream_is(
    transport: Transports, text: str, input_tokens: int, unpriced: bool
) -> None:
    # Answered to a request that was not streamed, it was priced a known $0 (unpriced False),
    # while the same body answered to a streamed request was unpriced: a 2xx came, so the
    # provider took the request and billed it, and the body did not say for what.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})

    llm = await transport.client(handler)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    usage = raised.value.usage
    assert usage is not None
    assert (raised.value.error_type, len(seen)) == ("malformed_response", 1)
    assert (usage.input_tokens, usage.unpriced, usage.billed_unreported) == (input_tokens, unpriced, unpriced)
    assert ("usage_reported" in usage.extra["attempt_log"][0]) is unpriced


async def _lost(error: Exception | None) -> httpx.Response:
    """A non-streamed request that reached the endpoint, whose reply is lost with ``error``
    (None: it never comes)."""
    if error is None:
        await asyncio.sleep(30)
    raise error or AssertionError("the call times out first")


@pytest.mark.parametrize(
    ("error", "error_type"),
    [
        (httpx.ReadTimeout("no reply"), "timeout"),
        (httpx.ReadError("connection reset by peer"), "connection_error"),
        (httpx.RemoteProtocolError("server disconnected without sending a response"), "connection_error"),
        (None, "timeout"),
    ],
    ids=["read timeout", "read error", "server disconnected", "no reply within the request timeout"],
)
async def test_a_reply_lost_after_its_request_was_sent_is_unpriced_not_free(
    error: Exception | None, error_type: str
) -> None:
    # Given a non-streamed call whose request went out (the provider has the whole prompt), and
    # whose reply never came
    llm = mock_client(
        lambda request: _lost(error),
        stream=False,
        request_timeout_s=0.2,
        connect_timeout_s=0.2,
        max_retries=0,
    )
    # When the call fails on it
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then what it cost is not known (the provider may have billed it): never a silent $0
    usage = raised.value.usage
    assert usage is not None
    assert (raised.value.error_type, usage.unpriced, usage.billed_unreported) == (error_type, True, True)
    assert (usage.charged_usd, usage.input_tokens, usage.output_tokens) == (Decimal(0), 0, 0)
    assert usage.extra["usage_reported"] is False
    assert usage.extra["estimated_prompt_tokens"] == estimate_prompt_tokens(MESSAGES)
    [lost] = usage.extra["attempt_log"]
    assert (lost["outcome"], lost["cost_usd"], lost["usage_reported"]) == (error_type, None, False)
    assert "streamed_chars" not in lost  # nothing was streamed


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ConnectTimeout("no connection"),
        httpx.PoolTimeout("no free connection"),
        httpx.ProxyError("the proxy refused the tunnel"),
        httpx.WriteError("broken pipe"),
        httpx.WriteTimeout("the request could not be written"),
    ],
    ids=lambda error: type(error).__name__,
)
@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
async def test_a_request_that_never_reached_the_provider_whole_was_not_billed(
    error: Exception, stream: bool
) -> None:
    # Given a request that never went out, or not whole (the provider cannot answer half a prompt)
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    llm = mock_client(handler, stream=stream, max_retries=0)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then nothing was billed: $0, and known to be $0
    usage = raised.value.usage
    assert usage is not None
    assert (usage.unpriced, usage.billed_unreported, usage.charged_usd) == (False, False, Decimal(0))
    assert "usage_reported" not in usage.extra["attempt_log"][0]


async def test_an_answer_after_a_reply_that_was_lost_is_unpriced() -> None:
    # Given a first request whose reply is lost, and a retry that answers in full
    requests: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if len(requests) == 1:
            raise httpx.ReadTimeout("no reply")
        return httpx.Response(200, json=body(prompt_tokens=1000, completion_tokens=100))

    llm = mock_client(handler, stream=False)
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    # Then the answer is priced, but the call's cost is not known: the lost one may have been billed
    usage = reply.usage
    assert (usage.unpriced, usage.billed_unreported) == (True, True)
    assert usage.cost_usd == Decimal("0.0028")
    lost, answer = usage.extra["attempt_log"]
    assert (lost["outcome"], lost["cost_usd"], lost["usage_reported"]) == ("timeout", None, False)
    assert "usage_reported" not in answer


async def test_a_call_cancelled_while_awaiting_its_reply_is_unpriced_not_free() -> None:
    # Given a non-streamed request that went out, and its caller cancelled before the reply came
    sent = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.set()
        await asyncio.sleep(30)
        raise AssertionError("the test cancels before this")

    llm = mock_client(handler, stream=False)
    call = asyncio.ensure_future(llm.complete(model="gpt-4.1", messages=MESSAGES))
    await asyncio.wait_for(sent.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError) as raised:
        await call
    await llm.aclose()
    # Then the usage on the error says its cost is not known, not that it was free
    usage = raised.value.usage  # type: ignore[attr-defined]
    assert isinstance(usage, LlmUsage)
    assert (usage.unpriced, usage.billed_unreported, usage.charged_usd) == (True, True, Decimal(0))
    [cancelled] = usage.extra["attempt_log"]
    assert (cancelled["outcome"], cancelled["cost_usd"], cancelled["usage_reported"]) == (
        "cancelled",
        None,
        False,
    )


OPENAI_400 = json.dumps(
    {
        "error": {
            "message": "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "empty_array",
        }
    },
    indent=2,  # as OpenAI sends it
).encode()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_refused_request_fails_at_once_with_openais_reason_on_one_line(
    transport: Transports, stream: bool
) -> None:
    # OpenAI's error body is pretty-printed: the reason was "HTTP 400: {\n  \"error\": {\n ..."
    # over eight lines, cut at 300 characters whatever it said.
    seen: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(400, content=OPENAI_400, headers={"content-type": "application/json"})

    llm = await client(transport, refuse, stream=stream)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    error = raised.value
    assert (error.error_type, error.status_code, error.attempts, len(seen)) == ("http_400", 400, 1, 1)
    assert "\n" not in str(error)
    assert str(error).endswith(
        ": HTTP 400 invalid_request_error (param messages, code empty_array): Invalid 'messages': "
        "empty array. Expected an array with minimum length 1, but got an empty array instead. "
        "(after 1 attempt(s))"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"error": "model not found"}', "HTTP 400: model not found"),
        (b'{"detail": "Not Found"}', 'HTTP 400: {"detail": "Not Found"}'),
        (
            b"<html>\n<body>\n404 Not Found\n</body>\n</html>",
            "HTTP 400: an HTML page (no content-type): 404 Not Found",
        ),
        (b'{"error": {"message": "' + b"x" * 500 + b'"}}', "HTTP 400: " + "x" * 299 + "…"),
    ],
    ids=["error a string", "another shape", "a page", "a long message"],
)
async def test_an_error_answer_in_another_shape_is_one_line_too(body: bytes, reason: str) -> None:
    llm = mock_client(lambda r: httpx.Response(400, content=body), stream=False)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert str(raised.value).split(": ", 1)[1] == f"{reason} (after 1 attempt(s))"


async def test_the_simulators_refusal_is_a_bad_request_the_client_does_not_retry() -> None:
    with run_simulator(SimulatorConfig(latency_ms=0)) as simulator:
        config = ClientConfig(base_url=simulator.base_url, api_key=ApiKey(SECRET))
        llm = OpenAICompatibleClient(config, prices=load_price_table())
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=[])
        await llm.aclose()
        refused = simulator.stats["bad_request"]
    assert (raised.value.error_type, raised.value.attempts, refused) == ("http_400", 1, 1)
    assert "HTTP 400 invalid_request_error (param messages, code empty_array): Invalid 'messages'" in str(
        raised.value
    )


@pytest.mark.parametrize(
    ("error", "outcome", "requests", "endpoint_failures"),
    [
        ({"message": "Provider returned error", "code": 502}, "reply_server_error", 3, 3),
        ({"message": "Overloaded", "type": "overloaded_error"}, "reply_server_error", 3, 3),
        ({"message": "slow down", "code": "429"}, "reply_rate_limited", 3, 0),
        ({"message": "bad parameter", "type": "invalid_request_error"}, "reply_request_error", 1, 0),
        ("something broke", "reply_server_error", 3, 3),
    ],
)
async def test_a_2xx_body_that_is_an_error_fails_as_its_http_equivalent_would(
    transport: Transports, error: Any, outcome: str, requests: int, endpoint_failures: int
) -> None:
    # A proxy (OpenRouter, LiteLLM) may answer 200 with an error object: it was the model's
    # malformed_response "reply has no choices", not retried whatever it said, its message lost.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"error": error})

    llm = await client(transport, handler, retry_sleep=_instant, stream=False)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert (raised.value.error_type, len(seen)) == (outcome, requests)
    assert llm.breaker.failure_count == endpoint_failures
    message = error["message"] if isinstance(error, dict) else error
    assert f": error in reply: {message} (after {requests} attempt(s))" in str(raised.value)
    usage = raised.value.usage
    assert usage is not None
    assert (usage.unpriced, usage.input_tokens) == (True, 0)  # it did not say what it used


async def _instant(_: float) -> None:
    return None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_error_message_over_lines_is_one_line_in_the_reason(stream: bool) -> None:
    # An error sent inside a stream put its message in the reason as it came: over lines
    error = {"message": "upstream said:\n  overloaded\r\n  try later", "type": "invalid_request_error"}
    body = error_in_stream(error) if stream else json.dumps({"error": error}).encode()
    llm = mock_client(lambda request: httpx.Response(200, content=body), stream=stream)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    assert str(raised.value).endswith(": upstream said: overloaded try later (after 1 attempt(s))")


CONTROLS = "line one\r\nline two\x00 \x1b[31mred\x1b[0m \x7f\x85end"


@pytest.mark.parametrize("where", ["error answer", "error object", "error in stream"])
async def test_an_endpoints_control_characters_never_reach_a_reason(where: str) -> None:
    # An error answer's text went into LlmCallFailed's reason, and StepFailed's, with its NUL,
    # DEL and terminal escapes (ESC [31m) as sent: a CLI or log printing it was recoloured.
    error = {"message": CONTROLS, "type": "invalid_request_error"}
    if where == "error answer":
        reply = httpx.Response(400, content=CONTROLS.encode(), headers={"content-type": "text/plain"})
    elif where == "error object":
        reply = httpx.Response(400, json={"error": error})
    else:
        reply = httpx.Response(200, content=error_in_stream(error))
    llm = mock_client(lambda request: reply, stream=where == "error in stream")
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    await llm.aclose()
    reason = str(raised.value)
    assert reason.isprintable()
    assert "line one line two\ufffd \ufffd[31mred\ufffd[0m \ufffd end (after 1 attempt(s))" in reason
