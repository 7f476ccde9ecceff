"""A request's line and headers are bounded under ``flowledger serve``, whichever HTTP parser it runs."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from flowledger.adapters.http.protocol import MAX_HEAD_BYTES
from tests.support.schemas import drop_schemas, scratch_schema
from tests.support.serve_process import serve_env, served

WRITER = "header-limit-writer-0123456789abcdef0123"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest,
    database_url: str,
    run_schemas: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str]]:
    """``flowledger serve --http <parser>`` as a process of its own, with a key, in a schema of
    its own; its base URL and the parser. One per parser for the module: every test sends it
    requests on connections of their own and reads the answers, and none writes (a refused
    request reaches no route), so no test sees another's; a start cost 5-6.5 s of set-up a test
    under coverage in the clean-clone CI run, eight of them."""
    home = tmp_path_factory.mktemp(f"serve-{request.param}")
    schema = scratch_schema("hl")
    env = serve_env(database_url, schema, home, FLOWLEDGER_API_KEYS=f"acme:writer:{WRITER}")
    options = ("--simulate-llm", "--no-access-log", "--http", request.param)
    try:
        with served(env, home / "serve.log", *options) as base:
            yield base, request.param
    finally:
        drop_schemas(database_url, schema)


def _answer(base: str, header_bytes: int) -> tuple[int, bytes, bytes]:
    """The status, headers and body answered to a GET carrying one extra header of ``header_bytes``."""
    port = int(base.rsplit(":", 1)[1])
    head = (
        f"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-API-Key: {WRITER}\r\n"
        f"X-Padding: {'p' * header_bytes}\r\n\r\n"
    ).encode()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        # Sent a piece at a time, reading as soon as there is an answer: a server that refuses
        # closes with bytes unread, and the reset that follows would drop an answer not yet read.
        try:
            for start in range(0, len(head), 16384):
                sock.sendall(head[start : start + 16384])
                if select.select([sock], [], [], 0.05)[0]:
                    break
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert answer, "the server answered nothing"
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split(b" ", 2)[1]), headers.lower(), body


def test_a_request_whose_headers_pass_the_bound_is_refused_and_one_within_it_served(
    server: tuple[str, str],
) -> None:
    base, parser = server
    # When a request carries headers past the bound (httptools read any size: a 50 MB header
    # was read whole and answered 200, the server's memory doubled; h11 stopped at 16 KiB)
    status, headers, body = _answer(base, 4 * MAX_HEAD_BYTES)
    # Then it is refused before it reaches the app: 431 in the envelope, under either parser
    # (h11 answered uvicorn's own plain 400)
    assert status == 431, (parser, body)
    assert json.loads(body) == {
        "success": False,
        "error": f"the request's line and headers are larger than the limit of {MAX_HEAD_BYTES:,} bytes",
    }
    # With the headers every answer of the service carries (it never reaches the app's layers)
    for header in (
        b"x-content-type-options: nosniff",
        b"x-frame-options: sameorigin",
        b"referrer-policy: no-referrer",
        b"cache-control: no-store",
        b"content-security-policy: ",
    ):
        assert header in headers, (parser, headers)
    # And headers within it are served under both parsers alike (h11 refused 32 KiB)
    status, _, body = _answer(base, MAX_HEAD_BYTES // 2)
    assert status == 200, body


def _head_of(size: int, *, close: bool = True) -> bytes:
    """A GET of /v1/tasks with the key whose line and headers are exactly ``size`` bytes."""
    start = f"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {WRITER}\r\n"
    start += "Connection: close\r\n" if close else ""
    padding = size - len(start) - len("X-Padding: \r\n\r\n")
    head = f"{start}X-Padding: {'p' * padding}\r\n\r\n".encode()
    assert len(head) == size
    return head


def _status_of(sock: socket.socket, head: bytes) -> int:
    """Send ``head`` whole and read the answer's status (the server may close with bytes unread)."""
    answer = b""
    try:
        sock.sendall(head)
        while b"\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert answer, "the server answered nothing"
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(("size", "status"), [(MAX_HEAD_BYTES, 200), (MAX_HEAD_BYTES + 1, 431)])
def test_the_bound_is_exact_on_a_connections_first_request_and_on_a_kept_alive_one(
    server: tuple[str, str], size: int, status: int
) -> None:
    """A probe found heads up to 81,920 bytes served under the 65,536-byte bound by httptools (the
    bytes of the first slice fed to the parser were not counted, nor the one in which the headers
    ended; on a kept-alive connection the next request's first read was not counted at all), and
    h11 served a head of any size that arrived in one read (its bound is on incomplete events)."""
    port = int(server[0].rsplit(":", 1)[1])
    # When a connection's first request has a head of exactly the bound, or one byte more
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        first = _status_of(sock, _head_of(size))
    # And when the same head follows a request on a kept-alive connection
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        assert _status_of(sock, _head_of(300, close=False)) == 200
        time.sleep(0.2)
        if select.select([sock], [], [], 0)[0]:
            sock.recv(65536)  # the rest of the first answer
        kept_alive = _status_of(sock, _head_of(size))
    # Then each is served at the bound and refused one byte past it
    assert (first, kept_alive) == (status, status)


def _raw(base: str, request: bytes) -> tuple[int, bytes, bytes]:
    """The status, headers and body answered to ``request``, sent as it is."""
    port = int(base.rsplit(":", 1)[1])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split(b" ", 2)[1]), headers.lower(), body


NOT_HTTP = {
    "url-byte": b"GET /v1/tasks/\xff HTTP/1.1\r\nHost: x\r\n\r\n",  # a byte no URL holds
    "content-length": b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "chunk-size": b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


def test_a_request_that_is_not_http_is_a_400_in_the_envelope(server: tuple[str, str]) -> None:
    base, parser = server
    for kind, request_bytes in NOT_HTTP.items():  # one server per parser for the three kinds
        # When a request the parser cannot read comes (uvicorn answered its own text/plain
        # "Invalid HTTP request received.", the one refusal outside the envelope)
        status, headers, body = _raw(base, request_bytes)
        # Then it is a 400 in the error envelope, with the service's headers, and the connection
        # closed
        assert status == 400, (parser, kind, body)
        assert json.loads(body) == {
            "success": False,
            "error": "the request is not HTTP/1.1 this server can read (its request line, a header or"
            " its framing): the connection is closed",
        }, kind
        assert b"content-type: application/json" in headers, kind
        assert b"x-content-type-options: nosniff" in headers, kind
        assert b"connection: close" in headers, kind
