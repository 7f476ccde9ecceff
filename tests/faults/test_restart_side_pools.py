"""After a server restart, the stores with pools of their own (the budget ledger, the API keys)
lend no connection the restart killed: the first calls after it succeed.

An outside probe, 1.5 s after a ``pg_ctl restart -m fast``: ``record_step`` with usage raised
``StoreUnavailable`` ("budgets: terminating connection due to administrator command") after
its step was stored, so the step's cost was never charged and a retry without a key would
have stored it twice; ``budgets.burn`` failed the same way, and an API key check failed twice
in a row (an HTTP 503 per stale connection), while the event store's own calls succeeded.
Lent only connections checked first, the first calls waited the pool's pause of a second after
each dead one; they take no longer than the event store's now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal

import pytest

from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.faults.ledger import fault_settings
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
COST = Decimal("0.01")
PROMPT_S = 0.5
"""What a first call after the restart may take (the event store's own: 0.27 s, measured)."""
USAGE = LlmUsage(
    provider="elsewhere",
    request_model="deepseek-v3.2",
    input_tokens=10,
    output_tokens=5,
    cost_usd=COST,
    price_version="test",
    latency_ms=1.0,
)


def test_a_step_charged_to_a_budget_right_after_a_restart_is_stored_and_charged_once(
    private_postgres: Callable[..., PrivateServer],
) -> None:
    # Given an engine whose budget ledger has connections open
    server = private_postgres()
    engine = Engine(settings=fault_settings(server.url))
    try:
        engine.budgets.set("tenant", None, "day", 100)
        engine.start_session("s", "wf")
        engine.record_step("s", "before", usage=USAGE)
        # When the server restarts and is back
        server.restart("fast")
        server.wait_ready()
        # Then a step with usage is recorded and charged, and the burn reads, promptly
        started = time.monotonic()
        engine.record_step("s", "after", usage=USAGE)
        (burn,) = engine.budgets.burn()
        assert time.monotonic() - started < 2 * PROMPT_S
        assert burn.spent_usd == 2 * COST
        assert engine.get_session("s").step_count == 2
    finally:
        engine.close()


def test_an_api_key_is_checked_right_after_a_restart(private_postgres: Callable[..., PrivateServer]) -> None:
    # Given a key store that has checked a key (its pool holds connections)
    server = private_postgres()
    keys = PostgresKeyStore(server.url, "faults", fault_settings(server.url))
    try:
        issued = keys.create("default", "admin")
        assert keys.find(issued.token) is not None
        # When the server restarts and is back
        server.restart("fast")
        server.wait_ready()
        # Then the key is found, each time, promptly
        started = time.monotonic()
        assert [keys.find(issued.token) is not None for _ in range(3)] == [True, True, True]
        assert time.monotonic() - started < PROMPT_S
    finally:
        keys.close()
