"""HTTP/1.1 framing for the LLM simulator: read one request, write JSON, raw or SSE answers.

A request the simulator cannot read is a ``BadRequest``, answered with an OpenAI-style error
body (``{"error": {"message", "type", "param", "code"}}``), never a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any, NamedTuple

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
_HEX = frozenset(b"0123456789abcdefABCDEF")

MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body read (a 413 beyond it): far above any chat request, far below memory."""


class BadRequest(Exception):
    """A request the simulator refuses with a 4xx; ``close`` when its framing is lost, so the
    connection cannot carry another request."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.close = message, param, code, status, close

    def body(self) -> dict[str, Any]:
        """The error as OpenAI sends it."""
        return error_body(self.message, "invalid_request_error", self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Request(NamedTuple):
    """One HTTP request: the method, the path without its query, lower-cased headers, the body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """The next request on the connection, or None once the client has closed it; the body is
    read whole, framed by its Content-Length or chunked (``writer`` answers ``100 Continue``)."""
    headers: dict[str, str] = {}
    try:  # one try around every line: a coroutine per line would cost ~4 µs a request
        request_line = await reader.readline()
        if not request_line:
            return None
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest("the request line is not 'METHOD target HTTP/1.x'", close=True)
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip():
                raise BadRequest(f"header line {line[:40]!r} is not 'name: value'", close=True)
            headers[name.lower()] = value.strip()
    except ValueError:  # longer than the reader's limit (64 KiB)
        raise BadRequest("a request or header line is longer than 64 KiB", close=True) from None
    method, target, _version = parts
    coding = headers.get("transfer-encoding")
    length = _content_length(headers) if coding is None else None  # chunked overrides a length
    if coding is not None and coding.lower() != "chunked":
        raise BadRequest(
            f"transfer-encoding {coding[:40]!r} is not supported (only chunked)",
            param="transfer-encoding",
            status=501,
            close=True,
        )
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await (_chunked_body(reader) if length is None else reader.readexactly(length))
    return Request(method, target.split("?", 1)[0].rstrip("/"), headers, body)


async def _line(reader: asyncio.StreamReader) -> bytes:
    """The next line of a chunked body."""
    try:
        return await reader.readline()
    except ValueError:  # longer than the reader's limit (64 KiB)
        raise BadRequest("a request or header line is longer than 64 KiB", close=True) from None


def _content_length(headers: dict[str, str]) -> int:
    given = headers.get("content-length")
    if given is None:
        return 0
    # int() would also take " 12", "1_2", "+12" and non-ASCII digits.
    if not (given.isascii() and given.isdigit()):
        raise BadRequest(f"content-length must be a count of bytes, got {given[:40]!r}", close=True)
    length = int(given)
    return length if length <= MAX_BODY_BYTES else _within_limit(length)


def _within_limit(size: int) -> int:
    if size > MAX_BODY_BYTES:
        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES:,} bytes", status=413, close=True)
    return size


async def _chunked_body(reader: asyncio.StreamReader) -> bytes:
    pieces: list[bytes] = []
    total = 0
    while True:
        size_line = await _line(reader)
        if not size_line:
            raise asyncio.IncompleteReadError(b"", None)  # the client went away mid-body
        size = size_line.split(b";", 1)[0].strip()
        # int(size, 16) would also take "-2", "0x2" and "1_0".
        if not size or not _HEX.issuperset(size):
            raise BadRequest(f"chunk size {size_line[:40]!r} is not hexadecimal", close=True)
        if not (length := int(size, 16)):
            break
        total = _within_limit(total + length)
        pieces.append(await reader.readexactly(length))
        if (await _line(reader)).strip():
            raise BadRequest("a chunk is longer than its size says", close=True)
    while (await _line(reader)).strip():  # trailer fields, not read
        pass
    return b"".join(pieces)


async def send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, extra: dict[str, str] | None = None
) -> None:
    """Answer ``payload`` as JSON."""
    await send_raw(writer, status, json.dumps(payload).encode(), extra)


async def send_raw(
    writer: asyncio.StreamWriter, status: int, body: bytes, extra: dict[str, str] | None = None
) -> None:
    """Answer ``body`` as it is, labelled JSON (a fault sends a broken one)."""
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        _request_id(),
    ]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


def _request_id() -> str:
    """OpenAI's ``x-request-id`` header line, on every answer (errors included): the SDK reads
    it as ``completion._request_id`` and ``APIStatusError.request_id``, None without it."""
    return f"x-request-id: req_{secrets.token_hex(16)}"


async def send_refusal(writer: asyncio.StreamWriter, refusal: BadRequest) -> None:
    """Answer a ``BadRequest``; says ``connection: close`` when the connection ends with it."""
    closing = {"connection": "close"} if refusal.close else None
    await send_json(writer, refusal.status, refusal.body(), closing)


async def send_stream(writer: asyncio.StreamWriter, payloads: list[str], gap_s: float) -> None:
    """Answer server-sent events, one ``data:`` line per payload, ``gap_s`` apart."""
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{_request_id()}"
    )
    writer.write(head.encode() + b"\r\n\r\n")
    for payload in payloads:
        data = f"data: {payload}\n\n".encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
        await asyncio.sleep(gap_s)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
