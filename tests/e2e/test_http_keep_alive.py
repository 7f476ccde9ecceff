"""``flowledger serve`` keeps an idle connection open past the usual clients' own idle expiry."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowledger.adapters.cli.serve import KEEP_ALIVE_S
from tests.support.serve_process import serve_env, served

HTTPX_KEEPALIVE_EXPIRY_S = 5.0
"""httpx's default idle expiry (``httpx.Limits``): Dify's HTTP Request node sends through httpx."""


@pytest.fixture
def base(database_url: str, pg_schema: str, tmp_path: Path) -> Iterator[str]:
    """``flowledger serve`` as a process of its own; its base URL."""
    env = serve_env(database_url, pg_schema, tmp_path)
    with served(env, tmp_path / "serve.log", "--simulate-llm", "--no-access-log") as url:
        yield url


def _exchange(sock: socket.socket) -> bytes:
    """One keep-alive GET of /healthz on ``sock``; its whole answer (b"" once the server closed)."""
    answer = b""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            answer += chunk
    except (ConnectionResetError, BrokenPipeError):
        return b""
    return answer


def _length(answer: bytes) -> int:
    """The content-length an answer's head declares (0 until the head is whole)."""
    head = answer.partition(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_an_idle_connection_outlives_the_clients_own_idle_expiry(base: str) -> None:
    # uvicorn's 5 s keep-alive was httpx's own expiry: a client reusing a connection as the
    # server closed it had its request dropped unanswered (ReadError on 1-4 of 200 webhook
    # calls per batch, every parser and loop). The server must be the one that waits longer.
    assert KEEP_ALIVE_S > 60
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        # Given a connection that served one request
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        # When it stays idle past httpx's expiry (and uvicorn's default)
        time.sleep(HTTPX_KEEPALIVE_EXPIRY_S + 1.5)
        # Then the server still answers on it
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
