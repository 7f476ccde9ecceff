"""A bound on a request's line and headers under ``flowledger serve``, whichever parser it runs.

uvicorn's httptools protocol keeps every byte of a request's URL and headers, however many: a
request with a 50 MB header was read whole (the server's peak memory went from 105 to 235 MB)
and answered 200. h11 stops at its ``max_incomplete_event_size`` (16 KiB by default), so the
two parsers did not even agree; and that bound is on a head still incomplete, so a longer one
that arrived in one read was served. Each parser is fed a request's head a bounded slice at a
time here, and both answer a head one byte past ``MAX_HEAD_BYTES`` with the same 431. A request
neither can read (a byte no URL holds, a ``Content-Length`` that is no count, a chunk size that is
not hexadecimal) is a 400 in the error envelope too: uvicorn answered its own text/plain
"Invalid HTTP request received.", the one refusal of the service outside the envelope.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from flowledger.adapters.http.errors import error_body
from flowledger.adapters.http.headers import ANSWER_HEADERS, ANSWER_POLICY

MAX_HEAD_BYTES = 64 * 1024
"""The most bytes a request may send before its headers end: its request line and headers."""
NOT_HTTP = (
    "the request is not HTTP/1.1 this server can read (its request line, a header or its framing):"
    " the connection is closed"
)
"""What a request the parser refuses is told (uvicorn's own words say no more than "invalid")."""


_SLICE = 8192
"""Bytes handed to the parser at a time until a request's headers are complete: httptools
gathers a header's value whole before it calls back, so the count must be taken here."""


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 (the error envelope, connection closed) to a
    request whose line and headers pass ``MAX_HEAD_BYTES``, before any of it reaches the app."""

    _head_bytes = 0
    _head_done = False
    _head_too_large = False

    def on_headers_complete(self) -> None:
        self._head_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # The bytes that follow are the next request's head: counted from here, not from its
        # first byte's callback (on_message_begin), which comes once a whole read or slice was
        # fed and left those bytes, up to a read's worth on a kept-alive connection, uncounted.
        self._head_bytes, self._head_done = 0, False
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        # Until the headers are complete, the parser is fed a slice at a time and the bytes
        # counted: a 50 MB header fed whole was gathered whole (peak memory 110 to 235 MB).
        # No slice goes past the bound, so a head is refused one byte past it, not a slice past.
        while data and not self._head_done:
            room = MAX_HEAD_BYTES - self._head_bytes
            if room <= 0:
                self._head_too_large = True
                self.send_400_response("")
                return
            piece, data = data[: min(_SLICE, room)], data[min(_SLICE, room) :]
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
        if data:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            refuse(self.transport, self.server_state, 400, NOT_HTTP)
            return
        refuse_head(self.transport, self.server_state)


def refuse_head(transport: asyncio.Transport, server_state: ServerState) -> None:
    """Answer 431 in the error envelope and close the connection: the head passed the bound."""
    too_large = f"the request's line and headers are larger than the limit of {MAX_HEAD_BYTES:,} bytes"
    refuse(transport, server_state, 431, too_large)


def refuse(transport: asyncio.Transport, server_state: ServerState, status: int, message: str) -> None:
    """Answer ``status`` with ``message`` in the error envelope, with the headers every answer of
    the service carries, and close the connection: the request never reached the app."""
    body = json.dumps(error_body(message)).encode()
    content = [STATUS_LINE[status]]
    for name, value in server_state.default_headers:
        content.extend([name, b": ", value, b"\r\n"])
    content.extend(
        [
            *(f"{name}: {value}\r\n".encode("ascii") for name, value in ANSWER_HEADERS),
            b"cache-control: no-store\r\n",
            b"content-security-policy: " + ANSWER_POLICY.encode("ascii") + b"\r\n",
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
    )
    transport.write(b"".join(content))
    transport.close()


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol, fed a request's head so that h11 never holds more than
    ``MAX_HEAD_BYTES`` of it: a head still incomplete at the bound is answered 431, as under
    httptools (h11's own bound, ``serve`` sets it to the same, is then never the one reached)."""

    def data_received(self, data: bytes) -> None:
        # h11 waits for a request's head while the peer's state is IDLE; what it holds then is
        # that head so far (bytes read while it answers a request are parsed after, as before).
        while data and self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            room = MAX_HEAD_BYTES - len(self.conn.trailing_data[0])
            if room <= 0:
                refuse_head(self.transport, self.server_state)
                return
            piece, data = data[:room], data[room:]
            super().data_received(piece)
        if data and not self.transport.is_closing():
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        refuse(self.transport, self.server_state, 400, NOT_HTTP)
