"""The transports under the client's ``httpx.AsyncClient``: aiohttp's (the default) or httpx's own.

The default sends through aiohttp (``httpx_aiohttp.AiohttpTransport``, as the OpenAI SDK's
``DefaultAioHttpClient`` does): the client keeps httpx's API (requests, responses,
``MockTransport`` in tests) and a request costs a fraction of the CPU. 500 concurrent
requests to the simulator on the 2-core machine (``bench/bench_llm.py``): httpx's own pool
0.95-2.65 ms of machine CPU per request, aiohttp's 0.30-0.99 ms.

``httpx_aiohttp`` 0.2 maps every ``aiohttp.ClientConnectionError`` to ``httpx.ConnectTimeout``,
so a dropped connection would read as a timeout; ``AiohttpTransport`` here restores the
difference (``connection_error`` vs ``timeout`` in the attempt log and the breaker).

httpx's own pool (``transport="httpx"``) is kept for endpoints aiohttp cannot serve the same
way (an HTTP/2-only gateway, a proxy set by httpx's environment variables). httpcore 1.0's
pool does work quadratic in its number of connections for every request it assigns
(``_assign_requests_to_connections`` counts all connections once per idle connection): 50
concurrent calls to a local server were capped near 150 requests/s, nearly all of it in
that method. Pools of at most ``shard_size`` connections keep each scan short.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator

import aiohttp
import httpx
import httpx_aiohttp

from flowledger.adapters.llm.config import ClientConfig


def build_transport(config: ClientConfig) -> httpx.AsyncBaseTransport:
    """The transport ``config.transport`` names, sized by its connection limits."""
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=config.max_keepalive_connections,
    )
    if config.transport == "httpx":
        return ShardedTransport(limits=limits, shard_size=config.pool_shard_size)
    return AiohttpTransport(limits=limits)


def _dropped(error: httpx.TimeoutException) -> httpx.TransportError | None:
    """The connection error an ``httpx_aiohttp`` "timeout" really was, or None for a real timeout."""
    cause = error.__cause__
    if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, asyncio.TimeoutError):
        return httpx.RemoteProtocolError(f"{type(cause).__name__}: {cause}")
    return None


class AiohttpTransport(httpx_aiohttp.AiohttpTransport):
    """``httpx_aiohttp``'s transport, with dropped connections reported as connection errors."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send through aiohttp; a body read that breaks off raises a TransportError too."""
        try:
            response = await super().handle_async_request(request)
        except httpx.TimeoutException as error:
            dropped = _dropped(error)
            if dropped is None:
                raise
            raise dropped from error
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _MappedStream(response.stream)
        return response


class _MappedStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except httpx.TimeoutException as error:
            dropped = _dropped(error)
            if dropped is None:
                raise
            raise dropped from error

    async def aclose(self) -> None:
        await self._stream.aclose()


class ShardedTransport(httpx.AsyncBaseTransport):
    """Round-robins requests over ``ceil(max_connections / shard_size)`` httpx pools."""

    def __init__(self, *, limits: httpx.Limits, shard_size: int = 8) -> None:
        total = limits.max_connections or 100
        keepalive = limits.max_keepalive_connections
        shards = max(1, math.ceil(total / shard_size))
        per_shard = httpx.Limits(
            max_connections=math.ceil(total / shards),
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / shards),
            keepalive_expiry=limits.keepalive_expiry,
        )
        # One TLS context for all pools: loading the CA bundle costs ~30 ms each time.
        ssl_context = httpx.create_ssl_context()
        self.pools = [httpx.AsyncHTTPTransport(limits=per_shard, verify=ssl_context) for _ in range(shards)]
        self._next = itertools.cycle(self.pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send on the next pool in turn."""
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self.pools:
            await pool.aclose()
