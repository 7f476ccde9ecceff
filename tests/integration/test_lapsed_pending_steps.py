"""Pending steps whose workers died and whose keys nobody retries do not stay in the session's
state for good: a later step gives them up (``worker_lost``), so snapshots stay bounded.

An outside probe: 200 workers that each recorded ``StepStarted`` (100 KB of input) and died,
their keys never retried, then 150 more steps: the session's snapshots were 20 MB, every one
carrying the 200 dead steps' inputs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest

from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.budget import CallScope
from flowledger.domain.session import Session
from flowledger.domain.session_leases import REAPED_PER_START, WORKER_LOST
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.budgets import step_hold_id
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.conftest import make_settings
from tests.integration.test_bounded_window import SNAPSHOT_LIMIT, latest_snapshot
from tests.integration.test_budgets import MODEL, client
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres
LEASE_S = 1.0


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    with Engine(settings=settings) as made:
        made.llm = ScriptedLlm()
        yield made


def die_mid_call(engine: Engine, session_id: str, key: str) -> None:
    """What a worker SIGKILLed during its model call leaves: its StepStarted, no outcome."""

    def started(uow: UnitOfWork) -> None:
        session: Session = uow.find(engine.session_uuid(session_id))
        session.start_step(
            step="answer",
            input={"prompt": "p" * 100_000},
            model=None,
            key=key,
            now=uow.now,
            lease_until=uow.now + timedelta(seconds=LEASE_S),
            worker=f"dead-{key}",
        )

    engine.store.write(session_id, started)


async def test_dead_workers_pending_steps_are_given_up_by_later_steps(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given workers that died mid-call under 80 keys nobody retries (100 KB of input each)
    engine.start_session("s", "customer_service")
    dead = [f"dead-{n}" for n in range(REAPED_PER_START + 16)]
    for key in dead:
        die_mid_call(engine, "s", key)
    assert len(engine.get_session("s").pending) == len(dead)

    # When their leases lapse and other steps run (two: at most 64 are given up per start)
    time.sleep(LEASE_S + 0.2)
    await engine.process_step("s", "answer", {"q": "first"}, idempotency_key="live-1")
    await engine.process_step("s", "answer", {"q": "second"}, idempotency_key="live-2")

    # Then none of them is pending, each recorded once as a lost attempt, and the steps ran
    state = engine.get_session("s")
    assert state.pending == ()
    lost = [
        entry.data["idempotency_key"]
        for entry in engine.history("s")
        if entry.event_type == "Session.StepFailed" and entry.data["error_type"] == WORKER_LOST
    ]
    assert sorted(lost) == sorted(dead)
    assert [r.idempotency_key for r in state.history] == ["live-1", "live-2"]

    # And a snapshot taken now carries none of their inputs
    for n in range(60):
        engine.record_step("s", "note", {"n": n})
    _, stored = latest_snapshot(database_url, pg_schema, engine, "s")
    assert len(stored) < SNAPSHOT_LIMIT

    # And a late retry of a given-up key runs its step afresh
    record = await engine.process_step("s", "answer", {"prompt": "p" * 100_000}, idempotency_key=dead[0])
    assert record.idempotency_key == dead[0]


async def test_a_live_lease_under_another_key_is_not_given_up(engine: Engine) -> None:
    # Given a worker that holds its key under a lease that still runs
    engine.start_session("s", "customer_service")
    die_mid_call(engine, "s", "held")

    # When another step starts and ends at once
    await engine.process_step("s", "answer", {"q": "other"}, idempotency_key="other")

    # Then the held step is still pending, untouched
    assert [p.idempotency_key for p in engine.get_session("s").pending] == ["held"]
    assert not [e for e in engine.history("s") if e.event_type == "Session.StepFailed"]


async def test_a_given_up_workers_budget_hold_is_taken_as_spent(database_url: str, pg_schema: str) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    config = SimulatorConfig(latency_ms=5, seed=5)
    with run_simulator(config) as simulator, Engine(settings=settings) as engine:
        engine.llm = client(simulator.base_url)
        engine.start_session("s", "support")
        engine.budgets.set("session", "s", "total", "5")
        # Given a worker that held $0.4 for its call under a key nobody retries, and died
        die_mid_call(engine, "s", "dead")
        (held,) = engine.get_session("s").pending
        scope = CallScope(tenant=engine.tenant, session="s", workflow="support", model=MODEL)
        hold = step_hold_id(engine.session_uuid("s"), "dead", held.worker, held.started_at)
        assert engine.budgets.reserve(scope, Decimal("0.4"), hold) is not None

        # When its lease lapses and another step runs, giving it up
        time.sleep(LEASE_S + 0.2)
        await engine.process_step("s", "answer", {"message": "hi"}, idempotency_key="live")

        # Then its call counts at its estimate (not $0) and nothing stays held
        [burn] = engine.budgets.burn()
        assert burn.reserved_usd == Decimal(0)
        assert burn.spent_usd >= Decimal("0.4")
