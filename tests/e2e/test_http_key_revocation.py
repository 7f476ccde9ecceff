"""A revoked API key is refused at once, by every server of the database: not after a cache of
good keys has run out (an outside probe, two `serve` processes on one database: a key revoked
with `flowledger keys revoke` still read tasks for 2.4 s on one server and 2.9 s on the other)."""

from __future__ import annotations

from contextlib import ExitStack

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.conftest import make_settings
from tests.e2e.live_http import bearer


def test_a_revoked_key_is_refused_at_once_by_every_server(database_url: str, pg_schema: str) -> None:
    """Both servers had just admitted the key (so each holds whatever it keeps of it); the next
    request after the revocation, on either, is a 401, as is the one after on the other."""
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme")
    store = PostgresKeyStore(database_url, pg_schema, settings)
    with ExitStack() as stack:
        stack.callback(store.close)
        issued = store.create("acme", "reader", "probe")
        clients = []
        for _ in range(2):  # two servers on one database, as two `serve` processes
            engine = stack.enter_context(Engine(settings=settings))
            clients.append(stack.enter_context(TestClient(create_app(engine, require_keys=True))))
        # Given a key each server has just admitted
        for client in clients:
            assert client.get("/v1/tasks", headers=bearer(issued.token)).status_code == 200
        # When it is revoked (as `flowledger keys revoke` does)
        assert store.revoke(issued.key.key_id)
        # Then the very next request to either server is refused, saying so
        for client in clients:
            refused = client.get("/v1/tasks", headers=bearer(issued.token))
            assert refused.status_code == 401
            assert refused.json()["error"] == "this API key is unknown or revoked"
        # And a key that was not revoked still works on both
        other = store.create("acme", "reader", "other")
        for client in clients:
            assert client.get("/v1/tasks", headers={"X-API-Key": other.token}).status_code == 200


def test_a_server_started_after_every_key_was_revoked_stays_closed(database_url: str, pg_schema: str) -> None:
    """Revoking every key (a leak: revoke them all, then issue new ones) must not open the API to
    whoever reaches it: a server then started ran open, every caller its default tenant's admin."""
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme")
    store = PostgresKeyStore(database_url, pg_schema, settings)
    with ExitStack() as stack:
        stack.callback(store.close)
        # Given a schema whose only key was revoked
        issued = store.create("acme", "writer", "leaked")
        assert store.revoke(issued.key.key_id)
        # When a server starts on it, finding its keys itself as `serve` does
        engine = stack.enter_context(Engine(settings=settings))
        client = stack.enter_context(TestClient(create_app(engine)))
        # Then a request without a key, or with the revoked one, is refused and writes nothing
        for headers in ({}, bearer(issued.token)):
            refused = client.post(
                "/v1/sessions", json={"session_id": "s1", "workflow": "cs"}, headers=headers
            )
            assert refused.status_code == 401, refused.text
        assert engine.log.head() == 0
