"""The most bytes the client reads of one reply: an endpoint that sends without end (a broken
proxy, a runaway stream, one SSE line that never ends) fails the attempt instead of the process.

Without it a reply was read whole into memory: a loopback server sending 1 MiB chunks without
end took the probe process to 3 GB in a 10 s attempt (a JSON body), and to 5.3 GB (one SSE
line without a newline) before the attempt ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import aiohttp
import httpx
from aiohttp.http_exceptions import ContentEncodingError

REPLY_LIMIT = "flowledger.reply_limit"
"""A request extension: the most bytes of the reply the aiohttp transport's lean path reads
(decompressed by aiohttp as they come, so they are counted as they expand)."""
_AS_SENT = (b"content-encoding", b"content-length")


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


async def read_body(response: httpx.Response, limit: int) -> bytes:
    """``response``'s body decoded, or ``ReplyTooLarge`` once more than ``limit`` bytes of it
    came: a gzip body is counted as it expands (``aread`` expanded it whole, unbounded)."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise ReplyTooLarge(limit, response.status_code)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_lines(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """``response``'s lines as an event stream has them (ended by CR, LF or CRLF, UTF-8), or
    ``ReplyTooLarge`` once more than ``limit`` bytes of it came: one line that never ends is
    not held whole. httpx's ``aiter_lines`` also ended a line at U+2028, U+2029 and U+0085
    (``str.splitlines``), which JSON may carry raw inside a chunk's text."""
    total = 0
    pending: list[bytes] = []
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise ReplyTooLarge(limit, response.status_code)
        pending.append(chunk)
        if b"\n" not in chunk and b"\r" not in chunk:
            continue
        # bytes.splitlines ends lines at CR and LF only, which never occur inside UTF-8 sequences.
        lines = b"".join(pending).splitlines(keepends=True)
        pending = [] if lines[-1].endswith((b"\n", b"\r")) else [lines.pop()]
        for line in lines:
            yield line.rstrip(b"\r\n").decode("utf-8", errors="replace")
    if pending:
        yield b"".join(pending).decode("utf-8", errors="replace")


def decoded_headers(response: aiohttp.ClientResponse) -> Sequence[tuple[bytes, bytes]]:
    """``response``'s headers for a body aiohttp has decompressed: without its content-encoding
    and content-length, which describe the bytes as sent (as they are when it was not encoded)."""
    if "Content-Encoding" not in response.headers:
        return response.raw_headers
    return [(name, value) for name, value in response.raw_headers if name.lower() not in _AS_SENT]


async def read_within(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of an aiohttp ``response`` (decompressed by aiohttp as it comes), or
    ``ReplyTooLarge`` past ``limit`` bytes of it (at once when its content-length says so)."""
    declared = None if "Content-Encoding" in response.headers else response.content_length
    if declared is not None:
        if declared > limit:
            raise ReplyTooLarge(limit, response.status, declared)
        return await response.read()  # one read, as before: the common case
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in response.content.iter_any():
            total += len(chunk)
            if total > limit:
                raise ReplyTooLarge(limit, response.status)
            chunks.append(chunk)
    except aiohttp.ClientPayloadError as error:
        # A body that is not in its content-encoding, as httpx says it (not a dropped connection).
        if isinstance(error.__cause__, ContentEncodingError):
            raise httpx.DecodingError(str(error.__cause__).strip()) from error
        raise
    return b"".join(chunks)
