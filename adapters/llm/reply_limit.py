"""The most bytes the client reads of one reply: an endpoint that sends without end (a broken
proxy, a runaway stream, one SSE line that never ends) fails the attempt instead of the process.

Without it a reply was read whole into memory: a loopback server sending 1 MiB chunks without
end took the probe process to 3 GB in a 10 s attempt (a JSON body), and to 5.3 GB (one SSE
line without a newline) before the attempt ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx

REPLY_LIMIT = "flowledger.reply_limit"
"""A request extension: the most bytes of the reply the aiohttp transport's lean path reads."""


class ReplyTooLarge(Exception):
    """A reply went past ``limit`` bytes; ``status_code`` is the reply's HTTP status."""

    def __init__(self, limit: int, status_code: int, declared: int | None = None) -> None:
        said = f" (content-length {declared:,})" if declared is not None else ""
        super().__init__(f"HTTP {status_code} reply longer than {limit:,} bytes{said}")
        self.limit, self.status_code, self.declared = limit, status_code, declared


class BoundedStream(httpx.AsyncByteStream):
    """A response body that raises ``ReplyTooLarge`` once more than ``limit`` bytes came."""

    def __init__(self, stream: httpx.AsyncByteStream, limit: int, status_code: int) -> None:
        self._stream, self._limit, self._status = stream, limit, status_code

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._stream:
            total += len(chunk)
            if total > self._limit:
                raise ReplyTooLarge(self._limit, self._status)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def bound(response: httpx.Response, limit: int) -> None:
    """Make ``response``'s body raise ``ReplyTooLarge`` past ``limit`` bytes (before it is read);
    raise it now when its content-length says so (a body already in memory is not read again)."""
    declared = response.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ReplyTooLarge(limit, response.status_code, int(declared))
    if isinstance(response.stream, httpx.AsyncByteStream):
        response.stream = BoundedStream(response.stream, limit, response.status_code)


async def read_within(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of an aiohttp ``response``, or ``ReplyTooLarge`` past ``limit`` bytes
    (at once when its content-length says so)."""
    declared = response.content_length
    if declared is not None:
        if declared > limit:
            raise ReplyTooLarge(limit, response.status, declared)
        return await response.read()  # one read, as before: the common case
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise ReplyTooLarge(limit, response.status)
        chunks.append(chunk)
    return b"".join(chunks)
