"""The client's two real transports (aiohttp's, the default, and httpx's own pool) over a real socket.

``served`` runs an ``httpx.MockTransport``-style handler behind a loopback HTTP server, so the
client tests elsewhere run the same handlers through the mock, aiohttp and httpx
(the ``transport`` fixture: those modules import ``transport_fixture``). A handler that raises an
``httpx.TransportError`` drops the connection; one that raises an ``httpx.TimeoutException``
never answers.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.transport import _CACHE_BOUND, WHOLE_BODY, AiohttpTransport, ShardedTransport
from flowledger.domain.errors import LlmCallFailed, ValidationError

Handler = Callable[[httpx.Request], Any]
MOCK_URL = "https://llm.test/v1"
OK_BODY = {
    "id": "chatcmpl-1",
    "model": "gpt-4.1-2025-04-14",
    "choices": [{"message": {"content": '{"message": "hi"}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5},
}
MESSAGES = [{"role": "user", "content": "hello"}]


@asynccontextmanager
async def served(handler: Handler) -> AsyncIterator[str]:
    """A loopback server answering with ``handler``; yields its base URL (``.../v1``)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        mirrored = httpx.Request(
            request.method, str(request.url), headers=list(request.headers.items()), content=body
        )
        try:
            result = handler(mirrored)
            response: httpx.Response = await result if inspect.isawaitable(result) else result
        except httpx.TimeoutException:
            await asyncio.sleep(3600)
            raise
        except httpx.TransportError:
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPInternalServerError() from None
        content = await response.aread()
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-encoding")
        }
        return web.Response(status=response.status_code, body=content, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


class Transports:
    """Builds clients whose requests reach a handler through one kind of transport."""

    def __init__(self, kind: str, stack: list[Any]) -> None:
        self.kind = kind
        self._stack = stack

    async def client(self, handler: Handler, **options: Any) -> OpenAICompatibleClient:
        """A client for ``handler``; ``options`` are ClientConfig fields or client keywords."""
        client_keys = {"retry_sleep", "rand", "clock"}
        keywords = {k: options.pop(k) for k in list(options) if k in client_keys}
        key = options.pop("api_key", ApiKey("sk-test-secret-1"))
        if self.kind == "mock":
            config = ClientConfig(base_url=MOCK_URL, api_key=key, **options)
            transport: httpx.AsyncBaseTransport | None = httpx.MockTransport(handler)
        else:
            context = served(handler)
            url = await context.__aenter__()
            self._stack.append(context)
            config = ClientConfig(base_url=url, api_key=key, transport=self.kind, **options)  # type: ignore[arg-type]
            transport = None
        llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=transport, **keywords)
        self._stack.append(_Closing(llm))
        return llm


class _Closing:
    """Closes a client at the end of a test that did not (closing twice is harmless)."""

    def __init__(self, llm: OpenAICompatibleClient) -> None:
        self._llm = llm

    async def __aexit__(self, *_: object) -> None:
        await self._llm.aclose()


@pytest.fixture(name="transport", params=["mock", "aiohttp", "httpx"])
async def transport_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Transports]:
    """The same client test through MockTransport, aiohttp's transport and httpx's pool."""
    stack: list[Any] = []
    yield Transports(request.param, stack)
    for context in reversed(stack):
        await context.__aexit__(None, None, None)


def path_of(request: httpx.Request) -> str:
    """The request's path, whichever server it reached."""
    return request.url.path


async def test_the_default_transport_is_aiohttp_and_httpx_stays_selectable() -> None:
    config = ClientConfig(base_url=MOCK_URL, api_key=ApiKey("sk-test-secret-1"))
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    assert isinstance(llm._pool().http._transport, AiohttpTransport)
    await llm.aclose()
    sharded = OpenAICompatibleClient(
        ClientConfig(base_url=MOCK_URL, api_key=ApiKey("sk-test-secret-1"), transport="httpx"),
        prices=load_price_table(),
    )
    assert isinstance(sharded._pool().http._transport, ShardedTransport)
    await sharded.aclose()
    with pytest.raises(ValidationError) as raised:
        ClientConfig(base_url=MOCK_URL, api_key=ApiKey("sk-test-secret-1"), transport="curl")  # type: ignore[arg-type]
    assert raised.value.field == "transport"


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_a_dropped_connection_is_a_retried_connection_error_on_both_transports(kind: str) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("dropped")
        return httpx.Response(200, json=OK_BODY)

    stack: list[Any] = []
    llm = await Transports(kind, stack).client(handler, retry_sleep=_no_sleep)
    try:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
        for context in stack:
            await context.__aexit__(None, None, None)
    assert [a["outcome"] for a in reply.usage.extra["attempt_log"]] == ["connection_error", "ok"]


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_a_server_that_never_answers_is_a_timeout_on_both_transports(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("never")

    stack: list[Any] = []
    llm = await Transports(kind, stack).client(
        handler, request_timeout_s=0.2, connect_timeout_s=0.2, max_retries=1, retry_sleep=_no_sleep
    )
    try:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
        for context in stack:
            await context.__aexit__(None, None, None)
    assert (raised.value.error_type, raised.value.attempts) == ("timeout", 2)


def closed_port() -> int:
    """A loopback port nothing listens on (a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("whole", [True, False], ids=["whole body", "streamed"])
async def test_a_refused_connection_is_a_connect_error_through_aiohttp_not_a_dropped_one(whole: bool) -> None:
    # (httpx_aiohttp maps every aiohttp connection error to ConnectTimeout, and a refusal read
    # as RemoteProtocolError, the error of a connection dropped after the request went out.)
    transport = AiohttpTransport()
    request = httpx.Request(
        "POST", f"http://127.0.0.1:{closed_port()}/v1", content=b"{}", extensions={WHOLE_BODY: whole}
    )
    try:
        with pytest.raises(httpx.ConnectError):
            await transport.handle_async_request(request)
    finally:
        await transport.aclose()


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_a_request_dropped_after_it_went_out_is_unpriced_and_a_refused_one_is_not(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("dropped")  # the server reads the request, then drops it

    stack: list[Any] = []
    dropped = await Transports(kind, stack).client(handler, max_retries=0)
    refused = OpenAICompatibleClient(
        ClientConfig(
            base_url=f"http://127.0.0.1:{closed_port()}/v1",
            api_key=ApiKey("sk-test-secret-1"),
            transport=kind,  # type: ignore[arg-type]
            max_retries=0,
        ),
        prices=load_price_table(),
    )
    usages = []
    try:
        for llm in (dropped, refused):
            with pytest.raises(LlmCallFailed) as raised:
                await llm.complete(model="gpt-4.1", messages=MESSAGES)
            assert raised.value.usage is not None
            usages.append(raised.value.usage)
    finally:
        await refused.aclose()
        for context in reversed(stack):
            await context.__aexit__(None, None, None)
    # The dropped request may have been billed (cost unknown); the refused one was not ($0)
    assert [(u.unpriced, u.extra["attempt_log"][0]["outcome"]) for u in usages] == [
        (True, "connection_error"),
        (False, "connection_error"),
    ]


async def test_the_aiohttp_transport_takes_the_pool_limit_and_sends_the_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=OK_BODY)

    async with served(handler) as url:
        config = ClientConfig(
            base_url=url, api_key=ApiKey("sk-test-secret-1"), max_connections=7, max_keepalive_connections=3
        )
        async with OpenAICompatibleClient(config, prices=load_price_table()) as llm:
            await asyncio.gather(*(llm.complete(model="gpt-4.1", messages=MESSAGES) for _ in range(20)))
            transport = llm._pool().http._transport
            assert isinstance(transport, AiohttpTransport)
            session = transport.client
            assert session is not None
            assert not callable(session)
            assert session.connector is not None
            assert session.connector.limit == 7
    assert len(seen) == 20
    assert seen[0].headers["authorization"] == "Bearer sk-test-secret-1"


async def test_a_whole_body_request_answers_as_the_streamed_path_does() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/ok"):
            return httpx.Response(201, content=b'{"ok": true}', headers={"x-n": "1"})
        return httpx.Response(404, text=f"no {request.url.path} for {request.headers['x-who']}")

    async with served(handler) as url:
        transport = AiohttpTransport()
        try:
            # When the same requests go through the lean path and the streamed one, several times
            answers = []
            for extensions in ({WHOLE_BODY: True}, {}, {WHOLE_BODY: True}):
                for path in ("/ok", "/missing"):
                    request = httpx.Request(
                        "POST", url + path, headers={"x-who": "me"}, content=b"{}", extensions=extensions
                    )
                    response = await transport.handle_async_request(request)
                    await response.aread()
                    answers.append(
                        (
                            response.status_code,
                            response.headers.get("x-n"),
                            response.content,
                            response.request,
                        )
                    )
        finally:
            await transport.aclose()
    # Then they answer alike: status, headers, body, the request attached
    assert answers[0][:3] == answers[2][:3] == answers[4][:3] == (201, "1", b'{"ok": true}')
    assert answers[1][:3] == answers[3][:3] == answers[5][:3] == (404, None, b"no /v1/missing for me")
    assert all(isinstance(answer[3], httpx.Request) for answer in answers)


async def test_the_lean_path_caches_stay_bounded() -> None:
    transport = AiohttpTransport()
    # When more distinct headers pass than the bound
    for n in range(3 * _CACHE_BOUND):
        transport._header_map(httpx.Headers({"x-n": str(n)}))
    # Then the cache started over instead of growing
    assert 0 < len(transport._headers) <= _CACHE_BOUND
    await transport.aclose()


async def _no_sleep(_: float) -> None:
    return None


async def _complete(url: str, kind: str, **options: Any) -> Any:
    """One ``complete`` through a fresh client on ``kind`` (no sleeps between attempts)."""
    config = ClientConfig(
        base_url=url,
        api_key=ApiKey("sk-test-secret-1"),
        transport=kind,  # type: ignore[arg-type]
        request_timeout_s=5.0,
        **options,
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=_no_sleep)
    try:
        return await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()


BAD_REPLIES = {
    "status line": b"HTTP/1.1 abc OK\r\n\r\n",
    "header past the limits": b"HTTP/1.1 200 OK\r\nx-huge: "
    + b"a" * 200_000
    + b"\r\ncontent-length: 0\r\n\r\n",
    "no HTTP at all": b"{}",
}


@asynccontextmanager
async def answering_first(reply: bytes) -> AsyncIterator[str]:
    """A raw loopback server: the first request gets ``reply`` (then the connection closes), the
    next ones a completion; yields its base URL."""
    good = httpx.Response(200, json=OK_BODY)
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
        good.content
    )
    served_count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served_count
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            served_count += 1
            writer.write(reply if served_count == 1 else answer + good.content)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


@pytest.mark.parametrize("reply", list(BAD_REPLIES), ids=list(BAD_REPLIES))
@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_reply_that_is_not_readable_http_is_a_retried_connection_error_on_both_transports(
    reply: str, kind: str, stream: bool
) -> None:
    # Through aiohttp, its ClientResponseError (a status line or header it cannot parse)
    # escaped the client as itself: the step failed as "ClientResponseError", not retried, with
    # no usage; httpx's pool gave a retried connection_error (RemoteProtocolError).
    async with answering_first(BAD_REPLIES[reply]) as url:
        completion = await _complete(url, kind, stream=stream)
    assert [a["outcome"] for a in completion.usage.extra["attempt_log"]] == ["connection_error", "ok"]


@pytest.mark.parametrize("reply", list(BAD_REPLIES), ids=list(BAD_REPLIES))
@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_a_connection_error_says_what_went_wrong_on_one_line(reply: str, kind: str) -> None:
    # The reason was the error's class alone ("connection failed: RemoteProtocolError"), the
    # same for a dropped connection, a status line that is not HTTP and a header past limits.
    async with answering_first(BAD_REPLIES[reply]) as url:
        with pytest.raises(LlmCallFailed) as raised:
            await _complete(url, kind, max_retries=0)
    message = str(raised.value)
    assert raised.value.error_type == "connection_error"
    assert "\n" not in message
    detail = message.split("connection failed: RemoteProtocolError: ", 1)[1]
    assert detail.split(" (after 1 attempt")[0].strip()  # something beyond the class's name


LOGIN_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in to\n the proxy</title></head>"
    b"<body><form>user</form></body></html>"
)
PAGES = {
    "text/html": ("text/html; charset=utf-8", LOGIN_PAGE),
    "HTML labelled JSON": ("application/json", b"  \r\n" + LOGIN_PAGE),
}


def _page_first(label: str) -> tuple[list[int], Handler]:
    """A handler answering the page ``label`` names (200) to the first request, then a completion."""
    content_type, page = PAGES[label]
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) == 1:
            return httpx.Response(200, content=page, headers={"content-type": content_type})
        return httpx.Response(200, json=OK_BODY)

    return seen, handler


@pytest.mark.parametrize("label", list(PAGES))
@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_200_with_an_html_page_is_not_an_answer_and_is_retried_on_both_transports(
    label: str, kind: str, stream: bool
) -> None:
    # A proxy's login page answered 200 was the model's "malformed_response": not retried,
    # billed at the estimate as if the model had answered (a whole reply), or "stream ended
    # before [DONE]" (a stream), its reason saying nothing of the page.
    seen, handler = _page_first(label)
    async with served(handler) as url:
        completion = await _complete(url, kind, stream=stream)
    log = completion.usage.extra["attempt_log"]
    assert [a["outcome"] for a in log] == ["not_an_api_reply", "ok"]
    assert len(seen) == 2
    # The page's attempt named no usage: none is made up, its cost is not known
    assert (log[0]["usage_reported"], log[0]["cost_usd"]) == (False, None)
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (10, 5)


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_page_on_every_attempt_fails_the_call_saying_so_on_one_line(kind: str, stream: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=LOGIN_PAGE, headers={"content-type": "text/html"})

    async with served(handler) as url:
        with pytest.raises(LlmCallFailed) as raised:
            await _complete(url, kind, stream=stream, max_retries=1)
    error = raised.value
    message = str(error)
    assert (error.error_type, error.attempts) == ("not_an_api_reply", 2)
    assert "\n" not in message
    assert "an HTML page" in message
    assert "'Sign in to the proxy'" in message
    assert "cost is not known" in message
    usage = error.usage
    assert usage is not None
    # No tokens made up; unpriced, as what the page's attempts cost is not known
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (0, 0, 0)
    assert (usage.unpriced, usage.billed_unreported) == (True, True)
    assert "estimated_prompt_tokens" in usage.extra


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_completion_labelled_as_a_page_is_taken_streamed_or_not(kind: str, stream: bool) -> None:
    # A completion labelled text/html was taken when not streamed, and refused as a page
    # (not_an_api_reply, retried, unpriced) when answered to a streamed request.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=OK_BODY, headers={"content-type": "text/html"})

    async with served(handler) as url:
        completion = await _complete(url, kind, stream=stream)
    assert [a["outcome"] for a in completion.usage.extra["attempt_log"]] == ["ok"]
    assert (completion.usage.input_tokens, completion.usage.unpriced) == (10, False)


SSE_REPLY = (
    b'data: {"id": "c1", "model": "gpt-4.1", '
    b'"choices": [{"delta": {"content": "{\\"message\\": \\"hi\\"}"}}]}\n\n'
    b'data: {"id": "c1", "choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n'
    b'data: {"id": "c1", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("kind", ["mock", "aiohttp", "httpx"])
async def test_a_stream_answered_to_a_request_not_streamed_is_read_as_one(kind: str) -> None:
    # A proxy that streams whatever it is asked: its whole stream, usage included, came to a
    # request not streamed and was "reply body is not JSON" (malformed_response, not retried,
    # its cost unknown), where the same stream to a streamed request is an answer, priced.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=SSE_REPLY, headers={"content-type": "text/event-stream"})

    llm = await Transports(kind, stack := []).client(handler, stream=False, retry_sleep=_no_sleep)
    try:
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        for context in reversed(stack):
            await context.__aexit__(None, None, None)
    assert reply.content == '{"message": "hi"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.unpriced) == (10, 5, False)
    assert reply.usage.finish_reasons == ("stop",)


async def test_a_call_waiting_for_a_free_connection_starts_its_deadline_when_it_gets_one(
    transport: Transports,
) -> None:
    # Given one connection, a 3 s deadline and a model that answers in 2 s; three calls at
    # once, and a breaker that opens on the first endpoint failure. (A 1.5 s answer against a
    # 2 s deadline left 0.5 s for the rest: the first call timed out once in a clean-clone run
    # on two busy cores. Each bound now has a second's room: 2 s < 3 s for a call, 2 + 2 s > 3 s
    # for a wait that counted against the deadline.)
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(2.0)
        return httpx.Response(200, json=OK_BODY)

    llm = await transport.client(
        handler,
        max_connections=1,
        max_keepalive_connections=1,
        request_timeout_s=3.0,
        max_retries=0,
        breaker_failure_threshold=1,
    )
    first, second, third = await asyncio.gather(
        *(llm.complete(model="gpt-4.1", messages=MESSAGES) for _ in range(3)), return_exceptions=True
    )
    # Then the first is answered, and so is the second, whose 2 s in the queue was not taken
    # from its deadline (it failed as an endpoint "timeout" at 3 s, unpriced, the breaker open)
    assert not isinstance(first, BaseException)
    assert not isinstance(second, BaseException)
    assert [a["outcome"] for a in second.usage.extra["attempt_log"]] == ["ok"]
    # And the third, still queued when its deadline passed, sent nothing: a pool timeout, $0 and
    # priced, that says nothing of the endpoint (the breaker stays closed)
    assert isinstance(third, LlmCallFailed)
    assert third.error_type == "pool_timeout"
    assert "max_connections" in str(third)
    assert third.usage is not None
    assert (third.usage.cost_usd, third.usage.unpriced) == (0, False)
    assert third.usage.extra["attempt_log"][0].get("usage_reported") is not False
    assert llm.breaker.state == "closed"


async def test_httpx_pools_send_to_a_pool_with_a_free_connection_not_merely_the_next() -> None:
    # Given httpx's pool split in two pools of two connections, and a server that holds some
    # requests until told and answers the others at once
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.content == b"hold":
            await release.wait()
        return httpx.Response(200, json=OK_BODY)

    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    transport = ShardedTransport(limits=limits, shard_size=2)
    async with served(handler) as url, httpx.AsyncClient(transport=transport, timeout=30) as http:
        held = [asyncio.create_task(http.post(url, content=b"hold"))]
        await asyncio.sleep(0.2)
        await http.post(url, content=b"quick")
        for _ in range(2):
            held.append(asyncio.create_task(http.post(url, content=b"hold")))
            await asyncio.sleep(0.2)
        # (the first two held calls fill one pool, the third is on the other)
        # When a request comes whose turn, in plain rotation, is the full pool's
        answered = await asyncio.wait_for(http.post(url, content=b"quick"), 5)
        # Then it goes to the pool with a free connection and is answered at once (it queued
        # behind the held calls, inside its deadline, while a connection stood free)
        assert answered.status_code == 200
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]
    # And every response closed gave its connection back to the count
    assert transport.busy == [0, 0]


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_an_idle_connection_is_dropped_before_a_five_second_server_closes_it(kind: str) -> None:
    # uvicorn (vLLM, the LiteLLM proxy) and Node close an idle connection after 5 s; the client
    # kept one 5 s (httpx) or 15 s (aiohttp) and reused it as the server closed it: 3-6 % of
    # calls 5 s apart failed their first attempt and were recorded unpriced. Given a server that
    # notes the client port of each request
    ports: list[int] = []
    runner, url = await _port_noting_server(ports)
    # (one pool of httpx's: each of its shards keeps connections of its own)
    config = ClientConfig(
        base_url=url,
        api_key=ApiKey("sk-test-secret-1"),
        transport=kind,  # type: ignore[arg-type]
        max_connections=8,
        max_keepalive_connections=8,
    )
    assert config.keepalive_expiry_s < 5
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    try:
        # When calls come back to back, and again after 4.5 s idle
        for pause in (0.0, 0.0, config.keepalive_expiry_s + 0.5):
            await asyncio.sleep(pause)
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
        await runner.cleanup()
    # Then the connection is kept between close calls, and not reused once idle that long
    assert ports[0] == ports[1]
    assert ports[2] != ports[1]


async def _port_noting_server(ports: list[int]) -> tuple[web.AppRunner, str]:
    """A loopback completions server (idle connections kept 60 s) that appends each request's
    client port to ``ports``; its runner and base URL."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(peer[1] if peer else 0)
        return web.json_response(OK_BODY)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=60)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def test_httpx_pools_keep_one_connection_warm_for_calls_one_at_a_time() -> None:
    # Rotation sent each call to the next of the pools (25 at 200 connections), whose idle
    # connection had expired by its next turn: calls one at a time each opened a new
    # connection (a TLS handshake to a real endpoint)
    ports: list[int] = []
    runner, url = await _port_noting_server(ports)
    config = ClientConfig(base_url=url, api_key=ApiKey("sk-test-secret-1"), transport="httpx")
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    try:
        for _ in range(5):
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
        await runner.cleanup()
    assert len(set(ports)) == 1


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("encoding", ["br", "zstd"])
async def test_a_reply_in_an_encoding_the_client_cannot_decode_is_one_malformed_attempt(
    kind: str, encoding: str
) -> None:
    # Given an endpoint answering 200 in an encoding neither transport decodes here (brotli and
    # zstandard are not installed; the client never asked for them)
    requests: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        requests.append(1)
        headers = {"content-type": "application/json", "content-encoding": encoding}
        return web.Response(body=b"\x1b\x8f\x00\xf8\x25\x82\x02\x0a\xc5\x13", headers=headers)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    config = ClientConfig(base_url=url, api_key=ApiKey("sk-test-secret-1"), transport=kind)  # type: ignore[arg-type]
    llm = OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=_no_sleep)
    try:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    finally:
        await llm.aclose()
        await runner.cleanup()
    # Then it is the unreadable answer it is on both transports: not retried, one failure for
    # the breaker (through aiohttp it was unreadable HTTP: a connection error, tried 3 times)
    assert (raised.value.error_type, len(requests)) == ("malformed_response", 1)
    assert llm.breaker.failure_count == 1
