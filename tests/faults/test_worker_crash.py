"""A worker SIGKILLed in the middle of its model call: the step is taken over once its lease lapses."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from flowledger.adapters.llm import build_engine
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.errors import StepInProgress
from flowledger.domain.session_views import SessionState
from flowledger.infrastructure import Engine, HistoryEntry
from flowledger.infrastructure.postgres.budgets import Burn
from tests.faults.ledger import EVENTS_TABLE, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
WORKER = Path(__file__).with_name("worker_process.py")
LEASE_S = 2.0
SESSION, KEY = "crashed-worker", "step-key-1"
PAYLOAD = {"s": SESSION, "n": KEY, "message": "hello"}
"""The request the worker sends (``worker_process.py``): a takeover repeats it under its key
(another payload under a used key is refused); ``s`` and ``n`` are what ``tally`` counts by."""


def held_usd(url: str) -> Decimal:
    """What the open reservations of the faults schema hold, in all."""
    query = "SELECT coalesce(sum(amount_usd), 0) FROM faults.budget_reservations"
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query.encode()).fetchone()
    return Decimal(row[0]) if row is not None else Decimal(0)


def wait_for_step_started(url: str, timeout_s: float) -> bool:
    query = f"SELECT count(*) FROM faults.{EVENTS_TABLE} WHERE topic LIKE '%Session.StepStarted'"
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query.encode()).fetchone()
            if row is not None and row[0] > 0:
                return True
            time.sleep(0.05)
    return False


class Takeover(threading.Thread):
    """Calls process_step with the crashed worker's key until it returns (or a deadline passes)."""

    def __init__(self, engine: Engine, deadline_s: float) -> None:
        super().__init__(daemon=True, name="takeover")
        self.engine = engine
        self.deadline = time.monotonic() + deadline_s
        self.outcome: object = None
        self.in_progress_replies = 0
        self.history: list[HistoryEntry] = []
        self.state: SessionState | None = None
        self.burn: list[Burn] = []

    def run(self) -> None:
        asyncio.run(self._call_then_close())

    async def _call_then_close(self) -> None:
        # The engine's HTTP connections belong to this thread's event loop: close them here.
        try:
            await self._call()
            self.history = self.engine.history(SESSION)
            self.state = self.engine.get_session(SESSION)
            self.burn = self.engine.budgets.burn()
        finally:
            await self.engine.aclose()

    async def _call(self) -> None:
        while (left := self.deadline - time.monotonic()) > 0:
            try:
                self.outcome = await asyncio.wait_for(
                    self.engine.process_step(SESSION, "greet", PAYLOAD, idempotency_key=KEY), left
                )
                return
            except StepInProgress:
                self.in_progress_replies += 1
                await asyncio.sleep(0.2)
            except Exception as error:  # reported by the test
                self.outcome = error
                return
        self.outcome = TimeoutError("the step was not taken over in time")


def test_d_a_worker_killed_mid_call_is_taken_over_after_its_lease_and_recorded(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None], tmp_path: Path
) -> None:
    server = private_postgres()
    slow = SimulatorConfig(latency_ms=5000, latency_sigma=0, seed=1)
    fast = SimulatorConfig(latency_ms=20, latency_sigma=0, seed=2)
    with run_simulator(slow) as slow_model, run_simulator(fast) as fast_model:
        settings = fault_settings(
            server.url, llm_base_url=fast_model.base_url, llm_api_key="sk-faults-1", step_lease_s=LEASE_S
        )
        engine = build_engine(settings=settings, client_options={"request_timeout_s": 10.0})
        engine.start_session(SESSION, "customer_service")
        engine.budgets.set("session", SESSION, "total", "100")

        # Given a worker process inside a 5 s model call, its StepStarted stored
        log = (tmp_path / "worker.log").open("w")
        arguments = [server.url, "faults", slow_model.base_url, SESSION, KEY, str(LEASE_S)]
        worker = subprocess.Popen(
            [sys.executable, str(WORKER), *arguments], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            assert wait_for_step_started(server.url, timeout_s=20), "the worker never started its step"
            deadline = time.monotonic() + 20
            while (dead_hold := held_usd(server.url)) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # its reservation follows its StepStarted

            # When another caller asks for the same key while the worker lives past one lease,
            takeover = Takeover(engine, deadline_s=15)
            takeover.start()
            time.sleep(LEASE_S * 1.5)
            worker_alive = worker.poll() is None
            calls_while_alive = fast_model.stats["requests"]
            # and then the worker is killed mid-call
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            killed_at = time.monotonic()
            takeover.join(20)
            took_over_after_s = time.monotonic() - killed_at
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
            log.close()
        calls_after = fast_model.stats["requests"]
        history = takeover.history

    # Then the step was taken over only once the worker was dead, with the abandoned
    # attempt on the books, and it was processed exactly once
    kinds = [
        (entry.event_type.rsplit(".", 1)[-1], entry.data.get("error_type"))
        for entry in history
        if entry.data.get("idempotency_key") == KEY
    ]
    acknowledged = [(SESSION, KEY)] if not isinstance(takeover.outcome, BaseException) else []
    result = tally(server.url, "faults", acknowledged)
    report(
        f"{result.line()} model_calls_while_alive={calls_while_alive} model_calls={calls_after} "
        f"in_progress_replies={takeover.in_progress_replies} took_over_after_kill_s={took_over_after_s:.1f} "
        f"events={kinds} outcome={type(takeover.outcome).__name__}"
    )
    assert worker_alive, "the worker died before it was killed: see worker.log"
    assert not isinstance(takeover.outcome, BaseException), repr(takeover.outcome)
    assert calls_while_alive == 0, "the model was called while the first worker held its lease"
    assert calls_after == 1
    # (lease renewals, however the store records them, are not attempts)
    assert [kind for kind in kinds if "Lease" not in kind[0]] == [
        ("StepStarted", None),
        ("StepFailed", "worker_lost"),
        ("StepStarted", None),
        ("StepProcessed", None),
    ]
    assert result.lost == 0
    assert result.doubled == 0
    # And the lost call, which named no model, is on the books under the engine's default model
    # as a call of unknown cost (it may have been billed: not a known $0), with no tokens made up
    assert takeover.state is not None
    [lost] = [f for f in takeover.state.failures if f.error_type == "worker_lost"]
    assert lost.usage is not None
    assert (lost.usage.request_model, lost.usage.unpriced, lost.usage.input_tokens) == (
        "deepseek-v3.2",
        True,
        0,
    )
    # And its budget hold was taken as spent at its estimate when the step was taken over (it was
    # left held, to be released as $0 once it lapsed), beside what the taker's call cost
    [taker] = takeover.state.history
    assert taker.usage is not None
    [burn] = takeover.burn
    assert dead_hold > 0
    assert (burn.spent_usd, burn.reserved_usd) == (dead_hold + taker.usage.charged_usd, Decimal(0))
