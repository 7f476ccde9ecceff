"""``flowledger serve`` as a process of its own, for tests of what only a real server shows
(its HTTP parser, its Host checks, a Dify run against it): started on a free loopback port,
waited for on ``/healthz``, stopped on leaving."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

START_S = 120.0
"""How long a start may take: the machine is shared, and starting may be slow."""


def serve_env(database_url: str, schema: str, home: Path, **variables: str) -> dict[str, str]:
    """This process's environment without its ``FLOWLEDGER_*`` variables, then the database,
    schema and home given, and ``variables`` (``FLOWLEDGER_API_KEYS=...``)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_")},
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": schema,
        "FLOWLEDGER_HOME": str(home),
        **variables,
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _start(env: dict[str, str], log: Path, options: list[str]) -> tuple[subprocess.Popen[bytes], str] | None:
    """The process and its URL once ``/healthz`` answers, or None if it exited first (the port
    was taken meanwhile, say); RuntimeError with its log past ``START_S``."""
    port = _free_port()
    command = [sys.executable, "-m", "flowledger.adapters.cli.main", "serve", "--port", str(port), *options]
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    while process.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            _stop(process)
            raise RuntimeError(
                f"flowledger serve did not answer /healthz in {START_S:g} s: {log.read_text()}"
            )
        time.sleep(0.2)
    return None


@contextmanager
def served(env: dict[str, str], log: Path, *options: str) -> Iterator[str]:
    """``flowledger serve <options>`` with ``env`` (``serve_env``), its output in ``log``; its
    base URL. Tried three times (a free port can be taken between the probe and the bind)."""
    for _ in range(3):
        started = _start(env, log, list(options))
        if started is not None:
            break
    else:
        raise RuntimeError(f"flowledger serve exited three times; the last time: {log.read_text()}")
    process, base = started
    try:
        yield base
    finally:
        _stop(process)
