"""Helpers for the HTTP edge tests: test keys, an app that needs them, a real uvicorn server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.simulated import simulated_client

ACME_WRITER = "acme-writer-0123456789abcdef0123456789"
ACME_READER = "acme-reader-0123456789abcdef0123456789"
GLOBEX_WRITER = "globex-writer-0123456789abcdef012345678"
KEYS = (("acme", "writer", ACME_WRITER), ("acme", "reader", ACME_READER), ("globex", "writer", GLOBEX_WRITER))


def bearer(secret: str) -> dict[str, str]:
    """The header that carries a key."""
    return {"Authorization": f"Bearer {secret}"}


READ_S = 60.0
"""A test client's read timeout on a live server: what it asserts is the answer, not its speed,
and on the shared CI machine a checkpoint that syncs tens of thousands of files (one schema
per test) stalled the machine's writes for up to 28 s (server log, this stop), past the 10 s
and 30 s these tests had (httpx.ReadTimeout, twice in three clean-clone runs)."""


def keyed_engine(simulator: Simulator, **overrides: Any) -> Engine:
    """An engine of tenant ``acme`` whose settings carry the test keys (in memory unless told);
    its model calls go through the real client to ``simulator``."""
    settings = {"database_url": "memory:", "tenant": "acme", "api_keys": KEYS, **overrides}
    return Engine(settings=make_settings(**settings), llm=simulated_client(simulator.base_url))


def keyed_app(engine: Engine) -> FastAPI:
    """An app over ``engine`` that needs a key on every route."""
    return create_app(engine, require_keys=True)


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port (real sockets, chunked bodies); its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
