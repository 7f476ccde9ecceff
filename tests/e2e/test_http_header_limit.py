"""A request's line and headers are bounded under ``flowledger serve``, whichever HTTP parser it runs."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.http.protocol import MAX_HEAD_BYTES

WRITER = "header-limit-writer-0123456789abcdef0123"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest, database_url: str, pg_schema: str, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """``flowledger serve --http <parser>`` as a process of its own, with a key; its base URL
    and the parser."""
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_")},
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": pg_schema,
        "FLOWLEDGER_HOME": str(tmp_path),
        "FLOWLEDGER_API_KEYS": f"acme:writer:{WRITER}",
    }
    command = [sys.executable, "-m", "flowledger.adapters.cli.main", "serve", "--port", str(port)]
    command += ["--simulate-llm", "--no-access-log", "--http", request.param]
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # the machine is shared: starting may be slow
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        yield base, request.param
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _answer(base: str, header_bytes: int) -> tuple[int, bytes]:
    """The status and body answered to a GET carrying one extra header of ``header_bytes``."""
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
    return int(status_line.split(b" ", 2)[1]), rest.partition(b"\r\n\r\n")[2]


def test_a_request_whose_headers_pass_the_bound_is_refused_and_one_within_it_served(
    server: tuple[str, str],
) -> None:
    base, parser = server
    # When a request carries headers past the bound (httptools read any size: a 50 MB header
    # was read whole and answered 200, the server's memory doubled; h11 stopped at 16 KiB)
    status, body = _answer(base, 4 * MAX_HEAD_BYTES)
    # Then it is refused before it reaches the app: 431 in the envelope (h11: uvicorn's own 400)
    if parser == "httptools":
        assert status == 431, body
        assert json.loads(body) == {
            "success": False,
            "error": f"the request's line and headers are larger than the limit of {MAX_HEAD_BYTES:,} bytes",
        }
    else:
        assert status == 400, body
    # And headers within it are served under both parsers alike (h11 refused 32 KiB)
    status, body = _answer(base, MAX_HEAD_BYTES // 2)
    assert status == 200, body
