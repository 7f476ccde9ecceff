"""Many tenants on one server: their engines share one store, so connections and threads stay
bounded by one engine's, however many tenants' keys call.

A private PostgreSQL of the test's own (``max_connections`` 40) keeps the shared server's
connections out of reach. Before the fix each tenant's engine opened a pool, a notifier, a
budget ledger and a checkpointer of its own (about 3 connections and 5 threads a tenant,
measured): under ``max_connections`` 100 the 34th tenant's first request waited out the
deadline and answered 503 "sorry, too many clients already", and this test's first case
ended in a client timeout (30 s) with tenants' engines queued behind each other's waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from tests.conftest import make_settings
from tests.e2e.live_http import READ_S, bearer, live_server
from tests.faults.server import PrivateServer, new_root

TENANTS = 200
POOL_SIZE = 5
MAX_CONNECTIONS = 40
APP_NAME = "many-tenants"


@pytest.fixture(scope="module")
def private_url() -> Iterator[str]:
    """A private cluster allowing ``MAX_CONNECTIONS``, its schema migrated; the URL names the app."""
    server = PrivateServer(new_root(), settings={"max_connections": str(MAX_CONNECTIONS)})
    server.start()
    try:
        url = f"{server.url}&application_name={APP_NAME}"
        migrate(url, "tenants", make_settings())
        yield url
    finally:
        server.cleanup()


def secret_of(tenant: str) -> str:
    """The writer key of ``tenant`` in these tests."""
    return f"{tenant}-writer-0123456789abcdef0123456789"


class Peak:
    """Samples the app's connections (by application_name) on a connection of its own."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url.replace(APP_NAME, "monitor"), autocommit=True)
        self.highest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
        ).fetchone()
        return int(row[0]) if row else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.highest = max(self.highest, self.now())
            time.sleep(0.02)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.highest = max(self.highest, self.now())
        self._conn.close()


def test_two_hundred_tenants_use_one_engines_connections_and_threads(private_url: str) -> None:
    # Given a keyed server whose keys name 200 tenants
    tenants = [f"t{i:03d}" for i in range(TENANTS)]
    keys = tuple((tenant, "writer", secret_of(tenant)) for tenant in tenants)
    engine = Engine(
        settings=make_settings(
            database_url=private_url,
            schema="tenants",
            tenant=tenants[0],
            api_keys=keys,
            pool_size=POOL_SIZE,
            # Time enough under CI's load (three test workers on two cores): this test is about
            # connections and threads, and with 3 s a tenant's task creation timed out there
            # (503), its assignment then answering "task 't1' not found".
            operation_deadline_s=30.0,
            http_rate_burst=1000,
        )
    )
    threads_before = threading.active_count()
    try:
        with (
            live_server(create_app(engine, require_keys=True)) as url,
            httpx.Client(base_url=url, timeout=90, limits=httpx.Limits(max_connections=16)) as http,
            Peak(private_url) as peak,
        ):

            def calls(tenant: str) -> tuple[int, int, str, int, int, str]:
                headers = bearer(secret_of(tenant))
                body = {"session_id": "same-id", "workflow": f"flow-of-{tenant}"}
                started = http.post("/v1/sessions", json=body, headers=headers)
                read = http.get("/v1/sessions/same-id", headers=headers)
                # A tenant's first assignment takes agent locks (a connection, lent per batch)
                agent = {"agent_id": f"agent-of-{tenant}", "name": "Ann", "skills": ["billing"]}
                registered = http.post("/v1/agents", json=agent, headers=headers)
                task = {"task_id": "t1", "description": "refund", "required_skills": ["billing"]}
                created = http.post("/v1/tasks", json=task, headers=headers)
                assigned = http.post("/v1/tasks/t1/assign", headers=headers).json()
                return (
                    started.status_code,
                    read.status_code,
                    read.json().get("workflow", read.text),
                    registered.status_code,
                    created.status_code,
                    (assigned.get("assignment") or {}).get("agent_id", str(assigned)),
                )

            # When each tenant starts a session and reads it, and assigns a task, 16 requests at a time
            with ThreadPoolExecutor(16) as pool:
                answers = dict(zip(tenants, pool.map(calls, tenants), strict=True))
            threads_during = threading.active_count()

        # Then every request was answered, each tenant reading its own session under one id and
        # its task given to its own agent
        assert answers == {
            tenant: (201, 200, f"flow-of-{tenant}", 201, 201, f"agent-of-{tenant}") for tenant in tenants
        }
        # and the server stayed within one engine's connections: the event store's and the budget
        # ledger's pools (pool_size each), the key table's pool (4), a few single connections and
        # the agent locks lent to the 16 batches that may take them at once
        bound = 2 * POOL_SIZE + 4 + 4 + 16
        assert peak.highest <= bound, f"{peak.highest} connections for {TENANTS} tenants (bound {bound})"
        # and threads do not grow with the tenants (the server's, the pool's workers, 16 clients)
        assert threads_during - threads_before <= 16 + POOL_SIZE + 10
    finally:
        engine.close()


def test_a_tenants_session_is_not_found_by_another_tenant_on_the_shared_store(private_url: str) -> None:
    # Given two tenants on one server
    keys = (("north", "writer", secret_of("north")), ("south", "writer", secret_of("south")))
    engine = Engine(
        settings=make_settings(database_url=private_url, schema="tenants", tenant="north", api_keys=keys)
    )
    try:
        with (
            live_server(create_app(engine, require_keys=True)) as url,
            httpx.Client(base_url=url, timeout=READ_S) as http,
        ):
            # When north starts a session
            body = {"session_id": "north-only", "workflow": "w"}
            assert http.post("/v1/sessions", json=body, headers=bearer(secret_of("north"))).status_code == 201
            # Then south does not find it, nor can it record a step on it
            south = bearer(secret_of("south"))
            assert http.get("/v1/sessions/north-only", headers=south).status_code == 404
            step = {"step": "s", "input": {}, "output": {}}
            assert http.post("/v1/sessions/north-only/steps", json=step, headers=south).status_code == 404
            north = http.get("/v1/sessions/north-only", headers=bearer(secret_of("north")))
            assert north.json()["version"] == 1
    finally:
        engine.close()
