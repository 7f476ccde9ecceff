"""The HTTP service keeps at most ``http_max_tenant_engines`` tenants' engines: past it the least
recently used one no request holds is closed (it was kept for ever: every tenant ever seen held
its task index and a listener called on every save of the shared store, without bound), and an
engine a request holds is closed only once that request is done."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.tenants import Tenants
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings
from tests.conftest import make_settings
from tests.e2e.live_http import bearer


@pytest.fixture
def base() -> Iterator[Engine]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    yield engine
    engine.close()


def listeners(engine: Engine) -> int:
    """How many services follow every save of the shared store (one per tenant's engine)."""
    return len(engine.store.saved_listeners)


def test_past_the_limit_the_least_recently_used_idle_engine_is_closed(base: Engine) -> None:
    # Given room for two tenants' engines
    tenants = Tenants(base, limit=2)
    before = listeners(base)

    # When three tenants make a request each, one after another
    engines = {}
    for tenant in ("t-a", "t-b", "t-c"):
        engines[tenant] = tenants.acquire(tenant)
        tenants.release(tenant)

    # Then two are kept, and the first one's services no longer follow the store
    assert len(tenants) == 2
    assert listeners(base) == before + 2
    # And a request of the first tenant gets a new engine, and the least recently used goes
    again = tenants.acquire("t-a")
    tenants.release("t-a")
    assert again is not engines["t-a"]
    assert tenants.acquire_kept("t-b") is None
    assert tenants.acquire_kept("t-c") is engines["t-c"]
    tenants.release("t-c")
    tenants.close()
    assert listeners(base) == before


def test_many_tenants_keep_the_engines_and_the_stores_listeners_bounded(base: Engine) -> None:
    tenants = Tenants(base, limit=8)
    before = listeners(base)
    for number in range(200):
        tenants.acquire(f"t-{number}")
        tenants.release(f"t-{number}")
        assert len(tenants) <= 8
    assert listeners(base) == before + 8
    tenants.close()


def test_an_engine_a_request_holds_is_not_closed_until_the_request_is_done(base: Engine) -> None:
    # Given room for one tenant's engine, and a request of tenant a in progress
    tenants = Tenants(base, limit=1)
    held = tenants.acquire("t-a")
    held.start_session("s-1", "w", ttl=timedelta(hours=1))

    # When tenant b makes a request meanwhile
    other = tenants.acquire("t-b")

    # Then a's engine still works (both are kept, over the limit, while both are held)
    assert len(tenants) == 2
    assert held.get_session("s-1").session_id == "s-1"
    tenants.release("t-b")
    # b, now idle and the most recent, is closed rather than a, still held
    assert len(tenants) == 1
    assert tenants.acquire_kept("t-b") is None
    assert held.get_session("s-1").session_id == "s-1"

    # And once a's request is done, a new request of b closes a's engine
    tenants.release("t-a")
    assert tenants.acquire("t-b") is not other
    assert tenants.acquire_kept("t-a") is None
    tenants.release("t-b")
    tenants.close()


def test_a_tenant_whose_engine_was_closed_finds_its_data_again(base: Engine) -> None:
    tenants = Tenants(base, limit=1)
    tenants.acquire("t-a").start_session("s-1", "w", ttl=timedelta(hours=1))
    tenants.release("t-a")
    tenants.acquire("t-b")
    tenants.release("t-b")
    assert tenants.acquire_kept("t-a") is None
    assert tenants.acquire("t-a").get_session("s-1").workflow == "w"
    tenants.release("t-a")
    tenants.close()


def test_the_base_engines_tenant_is_never_counted_or_closed(base: Engine) -> None:
    tenants = Tenants(base, limit=1)
    assert tenants.acquire(base.tenant) is base
    tenants.acquire("t-a")
    tenants.release("t-a")
    tenants.release(base.tenant)
    assert len(tenants) == 1
    assert base.get_session  # the base engine is still open: it is the app's caller's
    tenants.close()


def test_the_limit_is_a_setting_with_a_sane_default_read_from_the_environment() -> None:
    assert Settings().http_max_tenant_engines == 256
    read = Settings.from_env({"FLOWLEDGER_HTTP_MAX_TENANT_ENGINES": "3"})
    assert read.http_max_tenant_engines == 3
    with pytest.raises(ValidationError):
        Settings.from_env({"FLOWLEDGER_HTTP_MAX_TENANT_ENGINES": "0"})


def test_the_http_service_keeps_at_most_the_configured_tenants_engines() -> None:
    # Given a server with room for two tenants' engines and keys of five tenants
    tenants = [f"tenant-{n}" for n in range(5)]
    keys = tuple((tenant, "writer", f"{tenant}-writer-0123456789abcdef0123456789") for tenant in tenants)
    engine = Engine(settings=make_settings(database_url="memory:", api_keys=keys, http_max_tenant_engines=2))
    app = create_app(engine, require_keys=True)
    with TestClient(app) as client:
        # When each tenant starts a session, then the first reads its own again
        for tenant, _, secret in keys:
            started = client.post(
                "/v1/sessions", json={"session_id": "s-1", "workflow": tenant}, headers=bearer(secret)
            )
            assert started.status_code == 201, started.text
            assert len(app.state.gate.tenants) <= 2
        first = client.get("/v1/sessions/s-1", headers=bearer(keys[0][2]))

    # Then its session is found, over a new engine
    assert first.status_code == 200
    assert first.json()["workflow"] == "tenant-0"
    engine.close()


def test_a_new_tenant_gets_its_engine_while_every_kept_one_is_held(base: Engine) -> None:
    # Given room for one engine, held by a request of tenant a
    tenants = Tenants(base, limit=1)
    tenants.acquire("t-a")

    # When tenant b's engine is made, then it is held by b's request, not closed as the only idle one
    made = tenants.acquire("t-b")
    assert tenants.acquire_kept("t-b") is made
    tenants.release("t-b")
    tenants.release("t-b")
    tenants.release("t-a")
    assert len(tenants) == 1
    tenants.close()
