"""A reply past ``max_reply_bytes`` fails its attempt instead of filling the process's memory,
through MockTransport, aiohttp's transport and httpx's pool (``reply_limit``)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.errors import LlmCallFailed, ValidationError
from tests.unit.test_llm_transports import MESSAGES, OK_BODY, Transports, transport_fixture  # noqa: F401

LIMIT = 64 * 1024


async def _no_sleep(_: float) -> None:
    return None


def big_completion() -> dict[str, object]:
    choice = {"message": {"content": "x" * (2 * LIMIT)}, "finish_reason": "stop"}
    return {**OK_BODY, "choices": [choice]}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_reply_past_the_limit_fails_at_once_and_its_cost_is_unknown(
    transport: Transports, stream: bool
) -> None:
    # Streamed, a 2xx whose content-length passed the limit (a whole completion: a proxy that
    # ignores "stream") was refused before its stream counted as begun: recorded as a known $0.
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json=big_completion())

    llm = await transport.client(handler, max_reply_bytes=LIMIT, retry_sleep=_no_sleep, stream=stream)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    error = raised.value
    assert (error.error_type, error.attempts, len(calls)) == ("reply_too_large", 1, 1)
    assert error.usage is not None
    # A 2xx came: the provider billed the call and its usage was never read.
    assert (error.usage.unpriced, error.usage.billed_unreported) == (True, True)


async def test_a_stream_line_that_never_ends_fails_at_the_limit(transport: Transports) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        endless_line = b"data: " + b"x" * (2 * LIMIT)  # no newline: a line reader waits for one
        return httpx.Response(200, content=endless_line, headers={"content-type": "text/event-stream"})

    llm = await transport.client(handler, max_reply_bytes=LIMIT, stream=True, retry_sleep=_no_sleep)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert (raised.value.error_type, raised.value.attempts) == ("reply_too_large", 1)


async def test_an_error_answer_past_the_limit_is_the_error_its_status_is(transport: Transports) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, content=b"<html>" + b"x" * (2 * LIMIT))

    llm = await transport.client(handler, max_reply_bytes=LIMIT, max_retries=1, retry_sleep=_no_sleep)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    error = raised.value
    assert (error.error_type, error.status_code, error.attempts) == ("http_503", 503, 2)
    assert error.usage is not None
    assert error.usage.unpriced is False  # an error answer is not billed


async def endless(request: web.Request) -> web.StreamResponse:
    """A 200 whose body never ends and names no length (chunked), 64 KiB at a time."""
    media = "text/event-stream" if json.loads(await request.read()).get("stream") else "application/json"
    response = web.StreamResponse(headers={"content-type": media})
    await response.prepare(request)
    with_no_newline = b"x" * 65536
    try:
        while True:
            await response.write(with_no_newline)
            await asyncio.sleep(0)
    except (ConnectionError, RuntimeError):  # the client hung up
        return response


@pytest.fixture
async def endless_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_body_without_end_or_length_is_cut_at_the_limit_not_at_the_deadline(
    endless_url: str, kind: str, stream: bool
) -> None:
    # It was read into memory until request_timeout_s: 3 GB in a 10 s attempt on loopback.
    config = ClientConfig(
        base_url=endless_url,
        api_key=ApiKey("sk-test-secret-1"),
        transport=kind,  # type: ignore[arg-type]
        max_reply_bytes=1024 * 1024,
        request_timeout_s=20,
        stream=stream,
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=_no_sleep)
    began = time.perf_counter()
    try:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
    assert (raised.value.error_type, raised.value.attempts) == ("reply_too_large", 1)
    assert time.perf_counter() - began < 10


def gzip_reply(stream: bool, content: str) -> bytes:
    """A completion (or a stream of one) carrying ``content``, gzip-compressed."""
    if not stream:
        return gzip.compress(json.dumps({**OK_BODY, "choices": [{"message": {"content": content}}]}).encode())
    chunk = {"choices": [{"delta": {"content": content}, "finish_reason": "stop"}], "usage": OK_BODY["usage"]}
    return gzip.compress(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
async def gzip_url() -> AsyncIterator[str]:
    """Replies gzip-compressed; the path's first part is how many characters of content."""

    async def answer(request: web.Request) -> web.Response:
        stream = bool(json.loads(await request.read()).get("stream"))
        body = gzip_reply(stream, "x" * int(request.match_info["size"]))
        media = "text/event-stream" if stream else "application/json"
        return web.Response(body=body, headers={"content-type": media, "content-encoding": "gzip"})

    async def broken(request: web.Request) -> web.Response:
        stream = bool(json.loads(await request.read()).get("stream"))
        media = "text/event-stream" if stream else "application/json"
        return web.Response(
            body=b"not gzip " * 20, headers={"content-type": media, "content-encoding": "gzip"}
        )

    app = web.Application()
    app.router.add_post("/broken/v1/chat/completions", broken)
    app.router.add_post("/{size}/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def complete_from(url: str, kind: str, stream: bool) -> tuple[str, LlmCallFailed | None]:
    config = ClientConfig(
        base_url=url,
        api_key=ApiKey("sk-test-secret-1"),
        transport=kind,  # type: ignore[arg-type]
        max_reply_bytes=1024 * 1024,
        stream=stream,
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=_no_sleep)
    try:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    except LlmCallFailed as error:
        return "", error
    finally:
        await llm.aclose()
    return reply.content, None


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_compressed_reply_is_counted_as_it_expands(gzip_url: str, kind: str, stream: bool) -> None:
    # A 200 KB gzip body of 200 MB passed a 1 MiB limit: it was decompressed whole, after the count.
    expanded = 8 * 1024 * 1024
    assert len(gzip_reply(stream, "x" * expanded)) < 1024 * 1024
    content, error = await complete_from(f"{gzip_url}/{expanded}/v1", kind, stream)
    assert error is not None
    assert (error.error_type, error.attempts) == ("reply_too_large", 1)
    # One within the limit is read as it was before.
    content, error = await complete_from(f"{gzip_url}/1000/v1", kind, stream)
    assert (content, error) == ("x" * 1000, None)


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_body_that_is_not_in_its_content_encoding_is_a_malformed_response(
    gzip_url: str, kind: str, stream: bool
) -> None:
    # httpx.DecodingError ("Error -3 while decompressing data: incorrect header check")
    # escaped complete() as itself, not as LlmCallFailed, with no usage.
    _, error = await complete_from(f"{gzip_url}/broken/v1", kind, stream)
    assert error is not None
    assert (error.error_type, error.attempts) == ("malformed_response", 1)
    assert error.usage is not None
    assert error.usage.unpriced is True  # a 2xx came: billed, for what it does not say
    # The reason is one line that says what was wrong (aiohttp's spanned two lines:
    # "reply body cannot be decoded: 400, message:\n  Can not decode content-encoding: gzip").
    assert "\n" not in str(error)
    assert "reply body cannot be decoded: " in str(error)


@pytest.mark.parametrize("size", [0, 1023, 1024**3 + 1])
def test_a_reply_limit_out_of_range_is_refused(size: int) -> None:
    with pytest.raises(ValidationError) as raised:
        ClientConfig(
            base_url="http://127.0.0.1:1/v1", api_key=ApiKey("sk-test-secret-1"), max_reply_bytes=size
        )
    assert raised.value.field == "max_reply_bytes"
