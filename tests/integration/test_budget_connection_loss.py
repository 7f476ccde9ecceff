"""The budget ledger's connection ended by the server mid-step (a backend terminated, a
restart): the use is tried again within the operation's deadline, the step is recorded once and
its cost counted once.

An outside probe (a loopback proxy closing random connections under ``process_step`` through the
simulator) saw 5-12 in 100 calls fail with ``StoreUnavailable`` ("budgets: consuming input
failed: server closed the connection unexpectedly") while the database was there: the ledger
tried each use once, where the event store beside it lost no call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from flowledger.domain.budget import CallScope
from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.budgets import PostgresBudgetLedger
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm

pytestmark = pytest.mark.postgres


def _end_backend(database_url: str, pid: int) -> None:
    """``pg_terminate_backend`` of ``pid``, as an administrator would, and wait until it is gone."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 5
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the backend outlived its termination"
            time.sleep(0.01)


def end_first_connection_of(
    ledger: PostgresBudgetLedger, use: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Make the server end the connection the ledger's next ``use`` (reserve, settle) takes, once,
    before its first statement; the list gets the pid ended."""
    ended: list[int] = []
    armed = [False]
    connection = ledger._connection
    public: Callable[..., Any] = getattr(ledger, use)

    @contextmanager
    def ending_connection() -> Iterator[psycopg.Connection[Any]]:
        with connection() as conn:
            if armed[0]:
                armed[0] = False
                ended.append(conn.info.backend_pid)
                _end_backend(database_url, conn.info.backend_pid)
            yield conn

    def armed_use(*args: Any, **kwargs: Any) -> Any:
        armed[0] = not ended
        return public(*args, **kwargs)

    monkeypatch.setattr(ledger, "_connection", ending_connection)
    monkeypatch.setattr(ledger, use, armed_use)
    return ended


@pytest.mark.parametrize("use", ["reserve", "settle"])
async def test_a_ledger_connection_ended_mid_step_is_tried_again_and_the_step_recorded_once(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, use: str
) -> None:
    # Given a budget on a session whose steps call a model
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        engine.start_session("s1", "cs")
        engine.budgets.set("session", "s1", "total", "100")
        engine.llm = llm = ScriptedLlm()
        ledger = engine.budgets._ledger
        assert ledger is not None

        # When the server ends the connection the step's reservation (or settlement) takes
        ended = end_first_connection_of(ledger, use, database_url, monkeypatch)
        record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), 30)

        # Then the step is recorded (not failed), the model called once, its cost counted once
        assert len(ended) == 1, f"no {use} connection was ended"
        assert len(llm.calls) == 1
        assert record.usage == USAGE
        types = [e.event_type.rsplit(".", 1)[-1] for e in engine.history("s1")]
        assert [t for t in types if t.startswith("Step")] == ["StepStarted", "StepProcessed"]
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (USAGE.charged_usd, 0)
    finally:
        await engine.aclose()
        engine.close()


def test_a_reservation_whose_reply_was_lost_is_found_not_held_twice(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a ledger with a budget whose first reservation commits and then loses its reply
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        engine.budgets.set("tenant", None, "total", "100")
        ledger = engine.budgets._ledger
        assert ledger is not None
        reserve_once = ledger._reserve
        lost = [StoreUnavailable("budgets", "server closed the connection unexpectedly")]

        def reserve_then_lose_the_reply(*args: Any, **kwargs: Any) -> Any:
            made = reserve_once(*args, **kwargs)
            if lost:
                raise lost.pop()
            return made

        monkeypatch.setattr(ledger, "_reserve", reserve_then_lose_the_reply)
        scope = CallScope(tenant=engine.budgets.tenant, session="s1", workflow="cs", model="m", user=None)

        # When the call reserves
        hold = ledger.reserve(scope, Decimal("2"), datetime.now(UTC), timedelta(minutes=10), uuid4())

        # Then it holds its estimate once, and the hold it gets is the one that committed
        assert hold is not None
        assert hold.amount_usd == Decimal("2")
        [burn] = engine.budgets.burn()
        assert burn.reserved_usd == Decimal("2")
        ledger.settle(engine.budgets.tenant, hold, Decimal("1"), engine.clock())
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (Decimal("1"), 0)
    finally:
        engine.close()
