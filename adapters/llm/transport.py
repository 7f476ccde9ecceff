"""The transports under the client's ``httpx.AsyncClient``: aiohttp's (the default) or httpx's own.

The default sends through aiohttp (``httpx_aiohttp.AiohttpTransport``, as the OpenAI SDK's
``DefaultAioHttpClient`` does): the client keeps httpx's API (requests, responses,
``MockTransport`` in tests) and a request costs a fraction of the CPU. 500 concurrent
requests to the simulator on the 2-core machine (``bench/bench_llm.py``): httpx's own pool
0.95-2.65 ms of machine CPU per request, aiohttp's 0.30-0.99 ms.

``httpx_aiohttp`` 0.2 maps every ``aiohttp.ClientConnectionError`` to ``httpx.ConnectTimeout``,
so a dropped connection would read as a timeout; ``AiohttpTransport`` here restores the
difference (``connection_error`` vs ``timeout`` in the attempt log and the breaker), and the
one between a connection never made (``httpx.ConnectError``: the request did not go out) and
one dropped after it was made (``httpx.RemoteProtocolError``: the provider may have the
request, and bill it; see ``NOT_SENT``). A reply aiohttp cannot parse as HTTP (its
``ClientResponseError``) is ``httpx.RemoteProtocolError``, as httpx's pool raises for it.

httpx's own pool (``transport="httpx"``) is kept for endpoints aiohttp cannot serve the same
way (an HTTP/2-only gateway, a proxy set by httpx's environment variables). httpcore 1.0's
pool does work quadratic in its number of connections for every request it assigns
(``_assign_requests_to_connections`` counts all connections once per idle connection): 50
concurrent calls to a local server were capped near 150 requests/s, nearly all of it in
that method. Pools of at most ``shard_size`` connections keep each scan short.
"""

from __future__ import annotations

import asyncio
import functools
import math
import ssl
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import aiohttp
import httpx
import httpx_aiohttp
import httpx_aiohttp.transport
import yarl
from aiohttp.http_exceptions import ContentEncodingError
from multidict import CIMultiDict, CIMultiDictProxy

from flowledger.adapters.llm.config import ClientConfig
from flowledger.adapters.llm.reply_limit import REPLY_LIMIT, decoded_headers, read_within

NOT_SENT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
    httpx.WriteError,
    httpx.WriteTimeout,
)
"""The transport errors that show a request never reached the provider whole, so it cannot
have been billed: no connection (refused, timed out, none free in the pool, a proxy that would
not tunnel, a URL that cannot be sent), or the request's bytes not all written (an HTTP/1.1
server reads the whole body before a model sees the prompt). Any other error once the request
is with the transport (a read that times out or fails, a connection the server drops or
breaks, the ``request_timeout_s`` deadline, a cancel) may come after the provider took it:
its cost is not known. The aiohttp transport raises these classes as httpx's pool does
(``AiohttpTransport``). A kept-alive connection the server had closed, found closed as the
request is written, counts as sent: neither transport tells it from one dropped later."""
WHOLE_BODY = "flowledger.whole_body"
"""A request extension: the caller reads the whole reply at once, so the aiohttp transport may
read it before returning (any other transport ignores it)."""
_CACHE_BOUND = 64
HEADER_BYTES = 64 * 1024
"""The longest header (and status line) of a reply the aiohttp transport reads."""
MAX_HEADERS = 512
"""The most headers a reply may have on the aiohttp transport. aiohttp's own limits (8,190
bytes a header, 128 headers) refused a reply httpx's pool reads (100 KiB of headers in all,
however many): a gateway's 20 KiB debug header or 200 trace headers made the answer, which the
provider had billed, "not readable HTTP", a connection error retried into the same reply."""
K = TypeVar("K")
V = TypeVar("V")


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The TLS client context every HTTP client flowledger makes shares, built on first use:
    httpx's default (certifi's CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, read then).

    Building one reads and parses the CA bundle, about 18 ms of CPU each on the project's
    machine; each client's transport built its own, so a server with an engine per tenant paid
    it per engine. A context is safe to share between clients, threads and event loops."""
    return httpx.create_ssl_context()


def build_transport(config: ClientConfig) -> httpx.AsyncBaseTransport:
    """The transport ``config.transport`` names, sized by its connection limits."""
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=config.max_keepalive_connections,
        keepalive_expiry=config.keepalive_expiry_s,
    )
    if config.transport == "httpx":
        return ShardedTransport(limits=limits, shard_size=config.pool_shard_size)
    return AiohttpTransport(limits=limits, verify=shared_tls_context())


def _dropped(error: httpx.TimeoutException) -> httpx.TransportError | None:
    """The connection error an ``httpx_aiohttp`` "timeout" really was (``ConnectError`` for a
    connection never made, ``RemoteProtocolError`` for one dropped), or None for a real timeout."""
    cause = error.__cause__
    if isinstance(cause, aiohttp.ClientConnectorError):  # refused, DNS, TLS, proxy: nothing sent
        return httpx.ConnectError(f"{type(cause).__name__}: {cause}")
    if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, asyncio.TimeoutError):
        return httpx.RemoteProtocolError(f"{type(cause).__name__}: {cause}")
    return None


def _unreadable(error: aiohttp.ClientResponseError) -> httpx.RemoteProtocolError | httpx.DecodingError:
    """The error httpx's pool raises for a reply that is not HTTP (a status line that cannot be
    read, a header past aiohttp's limits): aiohttp's own ``ClientResponseError`` escaped the
    client unmapped, and the step failed as ``ClientResponseError``, not retried, its cost unknown
    to the usage, where httpx's pool gave a retried ``connection_error``.

    A body in an encoding aiohttp cannot decode (``br`` or ``zstd`` without their libraries,
    refused as the headers are read) is a ``DecodingError``, as a body not in its encoding is
    (``malformed_response``, not retried): it was read as unreadable HTTP, a connection error,
    retried twice more and counted by the breaker, each attempt paid for."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ContentEncodingError):
            return httpx.DecodingError(f"{error.message}")
        cause = cause.__cause__
    return httpx.RemoteProtocolError(f"the reply is not readable HTTP: {error.message} ({error.status})")


class AiohttpTransport(httpx_aiohttp.AiohttpTransport):
    """``httpx_aiohttp``'s transport, with dropped connections reported as connection errors,
    and a lean path for requests marked ``WHOLE_BODY`` (see ``_whole``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # A session made here is made again after a close: the client closes a pool's
        # transport as its loop ends, and a transport given to it serves the next loop too.
        self._own_session = options.get("client") is None
        # What the lean path converts once per distinct value instead of once per request.
        self._urls: dict[str, yarl.URL] = {}
        self._headers: dict[tuple[tuple[bytes, bytes], ...], CIMultiDictProxy[str]] = {}
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}

    def get_client(self) -> aiohttp.ClientSession:
        """The session ``httpx_aiohttp`` makes (one given, or a factory's, as it is), reading
        headers up to ``HEADER_BYTES`` each and ``MAX_HEADERS`` of them."""
        if self.client is not None:
            return super().get_client()
        # aiohttp's own default (100) where httpx's limits set none, as httpx_aiohttp leaves it.
        limit = 100 if self.limits.max_connections is None else self.limits.max_connections
        connector: aiohttp.BaseConnector
        if self.uds:
            connector = aiohttp.UnixConnector(
                path=self.uds, keepalive_timeout=self.limits.keepalive_expiry, limit=limit
            )
        else:
            connector = aiohttp.TCPConnector(
                keepalive_timeout=self.limits.keepalive_expiry,
                ssl=self.ssl_context,
                local_addr=(self.local_address, 0) if self.local_address else None,
                limit=limit,
            )
        return aiohttp.ClientSession(
            connector=connector,
            max_line_size=HEADER_BYTES,
            max_field_size=HEADER_BYTES,
            max_headers=MAX_HEADERS,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send through aiohttp; a body read that breaks off raises a TransportError too."""
        if request.extensions.get(WHOLE_BODY):
            return await self._whole(request)
        try:
            response = await super().handle_async_request(request)
        except httpx.TimeoutException as error:
            dropped = _dropped(error)
            if dropped is None:
                raise
            raise dropped from error
        except aiohttp.ClientResponseError as error:
            raise _unreadable(error) from error
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _MappedStream(response.stream)
        return response

    async def _whole(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read the whole reply before returning it (in memory).

        The same exchange as the streamed path (no redirects, the same timeouts and error
        mapping; aiohttp decompresses, so ``max_reply_bytes`` counts the body expanded),
        without the per-request work that path does around aiohttp: the URL is parsed, the
        headers converted and the timeout built once per distinct value; the body is read in
        one call, not through two async generators; the response's body is a ``ByteStream``.
        That work was half of a completion's client CPU at 200 concurrent calls (cProfile,
        docs/llm.md "Where a step's CPU goes").
        """
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        limit = request.extensions.get(REPLY_LIMIT)
        proxy = self.proxy
        try:
            with httpx_aiohttp.transport.map_aiohttp_exceptions():
                async with self.client.request(
                    request.method,
                    self._url(request.url),
                    headers=self._header_map(request.headers),
                    data=request.content or None,
                    allow_redirects=False,
                    # A bounded read lets aiohttp decompress as the bytes come, so the limit
                    # counts them expanded: httpx expanded a gzip body whole, after any count.
                    auto_decompress=limit is not None,
                    compress=False,
                    timeout=self._timeout(timeout),
                    server_hostname=request.extensions.get("sni_hostname"),
                    proxy=str(proxy.url) if proxy else None,
                    proxy_auth=aiohttp.BasicAuth(*proxy.auth) if proxy and proxy.auth else None,
                    proxy_headers=proxy.headers if proxy else None,
                ) as response:
                    body = await (response.read() if limit is None else read_within(response, limit))
        except httpx.TimeoutException as error:
            dropped = _dropped(error)
            if dropped is None:
                raise
            raise dropped from error
        except aiohttp.ClientResponseError as error:
            raise _unreadable(error) from error
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            response.status,
            headers=response.raw_headers if limit is None else decoded_headers(response),
            stream=httpx.ByteStream(body),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close the session; one made here is made anew by the next request (on its loop):
        it stayed closed, and every request after said ``RuntimeError: Session is closed``."""
        await super().aclose()
        if self._own_session:
            self.client = None

    def _url(self, url: httpx.URL) -> yarl.URL:
        text = str(url)
        parsed = self._urls.get(text)
        if parsed is None:
            parsed = _remember(self._urls, text, yarl.URL(text, encoded=True))
        return parsed

    def _header_map(self, headers: httpx.Headers) -> CIMultiDictProxy[str]:
        key = tuple(headers.raw)
        converted = self._headers.get(key)
        if converted is None:
            encoding = headers.encoding
            pairs = [(name.decode(encoding), value.decode(encoding)) for name, value in key]
            converted = _remember(self._headers, key, CIMultiDictProxy(CIMultiDict(pairs)))
        return converted

    def _timeout(self, timeout: dict[str, float | None]) -> aiohttp.ClientTimeout:
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        built = self._timeouts.get(key)
        if built is None:
            made = aiohttp.ClientTimeout(sock_connect=key[0], sock_read=key[1], connect=key[2])
            built = _remember(self._timeouts, key, made)
        return built


def _remember(cache: dict[K, V], key: K, value: V) -> V:
    """Put ``value`` in ``cache``; a cache that outgrew its bound starts over (a client sends
    to one endpoint with one set of headers: more distinct values are a caller's own use)."""
    if len(cache) >= _CACHE_BOUND:
        cache.clear()
    cache[key] = value
    return value


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
    """Spreads requests over ``ceil(max_connections / shard_size)`` httpx pools: the first pool
    that has a free connection, else the least busy.

    Plain rotation sent a request to a pool whose connections were all held by slow calls while
    another pool's stood free: it queued there, inside its attempt's deadline, and ran out of it
    as an endpoint "timeout", unpriced (16 connections in two pools, 8 calls of 2.5 s on one, 3
    of 6 later 1.3 s calls timed out at a 3 s deadline; none through aiohttp's one pool). It
    also spread a trickle of calls over all the pools (25 at the default 200 connections), each
    pool's idle connection expiring before its turn came again: every call at one a second
    opened a new connection (a TLS handshake). The first pool with room keeps them warm.
    """

    def __init__(self, *, limits: httpx.Limits, shard_size: int = 8) -> None:
        total = limits.max_connections or 100
        keepalive = limits.max_keepalive_connections
        shards = max(1, math.ceil(total / shard_size))
        per_shard = httpx.Limits(
            max_connections=math.ceil(total / shards),
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / shards),
            keepalive_expiry=limits.keepalive_expiry,
        )
        tls = shared_tls_context()
        self.pools = [httpx.AsyncHTTPTransport(limits=per_shard, verify=tls) for _ in range(shards)]
        self._size = per_shard.max_connections or total
        # Requests each pool holds a connection for: from the send until the response is closed.
        self.busy = [0] * shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send on the first pool with a free connection (``_pick``)."""
        index = self._pick()
        self.busy[index] += 1
        try:
            response = await self.pools[index].handle_async_request(request)
        except BaseException:
            self.busy[index] -= 1
            raise
        if isinstance(response.stream, httpx.AsyncByteStream):  # an httpx pool's always is
            response.stream = _Released(response.stream, self, index)
        else:
            self.busy[index] -= 1
        return response

    def _pick(self) -> int:
        busy = self.busy
        for index, held in enumerate(busy):
            if held < self._size:
                return index
        return min(range(len(busy)), key=busy.__getitem__)

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self.pools:
            await pool.aclose()


class _Released(httpx.AsyncByteStream):
    """A pool's response body that gives its connection back to the count when closed."""

    def __init__(self, stream: httpx.AsyncByteStream, owner: ShardedTransport, index: int) -> None:
        self._stream = stream
        self._owner: ShardedTransport | None = owner
        self._index = index

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:  # once, however often it is closed
            owner.busy[self._index] -= 1
        await self._stream.aclose()
