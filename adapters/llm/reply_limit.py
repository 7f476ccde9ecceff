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


async def _within(chunks: AsyncIterator[bytes], limit: int, status_code: int) -> AsyncIterator[bytes]:
    """``chunks`` as they come, or ``ReplyTooLarge`` once more than ``limit`` bytes of them came:
    the one count every reader of a reply goes through."""
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise ReplyTooLarge(limit, status_code)
        yield chunk


def bound(response: httpx.Response, limit: int) -> None:
    """``ReplyTooLarge`` now when ``response``'s content-length says it is past ``limit`` bytes;
    a body without one is counted as it is read (``read_body``, ``read_lines``)."""
    declared = response.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ReplyTooLarge(limit, response.status_code, int(declared))


async def read_body(response: httpx.Response, limit: int) -> bytes:
    """``response``'s body decoded, or ``ReplyTooLarge`` once more than ``limit`` bytes of it
    came: a gzip body is counted as it expands (``aread`` expanded it whole, unbounded)."""
    return b"".join([chunk async for chunk in _within(response.aiter_bytes(), limit, response.status_code)])


async def read_lines(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """``response``'s lines as an event stream has them (ended by CR, LF or CRLF, UTF-8), or
    ``ReplyTooLarge`` once more than ``limit`` bytes of it came: one line that never ends is
    not held whole. httpx's ``aiter_lines`` also ended a line at U+2028, U+2029 and U+0085
    (``str.splitlines``), which JSON may carry raw inside a chunk's text."""
    pending: list[bytes] = []
    async for chunk in _within(response.aiter_bytes(), limit, response.status_code):
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
    try:
        return b"".join(
            [chunk async for chunk in _within(response.content.iter_any(), limit, response.status)]
        )
    except aiohttp.ClientPayloadError as error:
        # A body that is not in its content-encoding, as httpx says it (not a dropped connection).
        if isinstance(error.__cause__, ContentEncodingError):
            raise httpx.DecodingError(str(error.__cause__).strip()) from error
        raise
