"""``flowledger serve`` open on loopback (no key anywhere) answers callers on this machine only,
whatever name a browser was led to use for it (DNS rebinding)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.http.auth import OPEN_RECHECK_S, loopback_host
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.conftest import make_settings
from tests.support.serve_process import serve_env, served


@pytest.fixture
def open_server(database_url: str, pg_schema: str, tmp_path: Path) -> Iterator[str]:
    """``flowledger serve`` on 127.0.0.1 with no key configured; its base URL."""
    env = serve_env(database_url, pg_schema, tmp_path)
    with served(env, tmp_path / "serve.log", "--simulate-llm", "--no-access-log") as base:
        yield base


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


def test_an_open_server_closes_within_seconds_of_the_first_key_being_created(
    open_server: str, database_url: str, pg_schema: str
) -> None:
    # Given a server that started open (no key anywhere)
    assert httpx.get(f"{open_server}/v1/agents").status_code == 200
    # When the first key is created, as `flowledger keys create` does, while it runs
    store = PostgresKeyStore(database_url, pg_schema)
    try:
        token = store.create("acme", "reader").token
    finally:
        store.close()
    # Then within the recheck a request without a key is refused, and writes nothing
    deadline = time.monotonic() + OPEN_RECHECK_S + 5
    while httpx.get(f"{open_server}/v1/agents").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    refused = httpx.post(f"{open_server}/v1/sessions", json={"session_id": "late", "workflow": "cs"})
    assert refused.status_code == 401, refused.text
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.log.head() == 0
    # And the new key is served, as its tenant's reader
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{open_server}/v1/agents", headers=headers).status_code == 200
    assert httpx.post(f"{open_server}/v1/agents", json={}, headers=headers).status_code == 403
