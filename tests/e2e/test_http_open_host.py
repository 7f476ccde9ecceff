"""``flowledger serve`` open on loopback (no key anywhere) answers callers on this machine only,
whatever name a browser was led to use for it (DNS rebinding)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.http.auth import loopback_host
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def open_server(database_url: str, pg_schema: str, tmp_path: Path) -> Iterator[str]:
    """``flowledger serve`` on 127.0.0.1 with no key configured; its base URL."""
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_")},
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": pg_schema,
        "FLOWLEDGER_HOME": str(tmp_path),
    }
    command = [sys.executable, "-m", "flowledger.adapters.cli.main", "serve", "--port", str(port)]
    command += ["--simulate-llm", "--no-access-log"]
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
        yield base
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_an_open_loopback_server_refuses_a_host_that_is_not_this_machine(
    open_server: str, database_url: str, pg_schema: str
) -> None:
    body = {"session_id": "rebound", "workflow": "cs"}
    # When a request reaches it naming another host (a page whose name was made to resolve to
    # 127.0.0.1: it was served as admin, 201)
    for host in ("attacker.example", "attacker.example:80", "127.0.0.1.attacker.example"):
        refused = httpx.post(f"{open_server}/v1/sessions", json=body, headers={"Host": host})
        # Then it is refused, in the envelope, and nothing is written
        assert refused.status_code == 403, (host, refused.text)
        assert "on this machine only" in refused.json()["error"]
    page = httpx.get(f"{open_server}/dashboard", headers={"Host": "attacker.example"})
    assert page.status_code == 403
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.log.head() == 0
    # And this machine's names are served as before
    port = open_server.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(f"{open_server}/v1/tasks", headers={"Host": host}).status_code == 200, host
    assert httpx.post(f"{open_server}/v1/sessions", json=body).status_code == 201


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("LOCALHOST:8000", True),
        ("127.0.0.1:8000", True),
        ("127.8.9.10", True),
        ("[::1]:8000", True),
        ("::1", True),
        ("", False),
        ("10.0.0.1:8000", False),
        ("localhost.attacker.example", False),
        ("[::ffff:10.0.0.1]", False),
    ],
)
def test_a_host_header_names_this_machine_only_as_localhost_or_a_loopback_address(
    host: str, local: bool
) -> None:
    assert loopback_host(host) is local
