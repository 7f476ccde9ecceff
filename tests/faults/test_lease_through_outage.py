"""A worker whose database is briefly unreachable keeps its step: once the path is back, it
renews its lease before the lease lapses, and a caller elsewhere waiting under the step's key
never calls the model while the worker lives.

An outside probe (3 s leases, a 1.5 s operation deadline, the database stopped right after a
renewal and started again 2.6 s later, well within the lease): the renewal that failed in the
outage was tried again only a third of the lease later, after the lease had lapsed with the
database up for 0.4 s; a caller in another engine took the step over 3.2 s after the outage
began, recording ``worker_lost``, and the model was called twice for one key.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import psycopg
import pytest

from flowledger.domain.errors import StepInProgress, StoreUnavailable
from flowledger.domain.values import JsonObject
from flowledger.infrastructure import Engine
from tests.faults.ledger import EVENTS_TABLE, fault_settings
from tests.faults.proxy import losing_proxy
from tests.faults.server import PrivateServer
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres
LEASE_S = 6.0
PERIOD_S = LEASE_S / 3
"""How often a live worker renews its lease."""
DEADLINE_S = 2.8
"""Longer than a renewal period (so a renewal that fails in the outage fails late in the
lease) and shorter than two: a failed renewal ends 4.8 s into the 6 s lease."""
MODEL_CALL_S = 10.0
"""The worker's model call: from before its first renewal (a period in) to past the lease as it
stood when the path was cut (a lease after that renewal)."""
SESSION, KEY = "leased", "K"
INPUT: JsonObject = {"q": 1}


def renewals(url: str) -> int:
    query = f"SELECT count(*) FROM faults.{EVENTS_TABLE} WHERE topic LIKE '%StepLeaseRenewed'"
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row is not None else 0


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Caller(threading.Thread):
    """Asks for the step under its key every 0.1 s (each ask gives up at once while the key is
    held) until it gets an answer or ``stop`` is set."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(daemon=True, name="other-caller")
        self.engine = engine
        self.stop = threading.Event()
        self.answered_at: float | None = None

    def run(self) -> None:
        asyncio.run(self._ask())

    async def _ask(self) -> None:
        while not self.stop.is_set():
            try:
                await self.engine.process_step(SESSION, "x", INPUT, idempotency_key=KEY)
                self.answered_at = time.monotonic()
                return
            except (StepInProgress, StoreUnavailable):
                await asyncio.sleep(0.1)


def test_a_worker_cut_off_from_the_database_for_less_than_its_lease_keeps_its_step(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    server = private_postgres()
    upstream = urlsplit(server.url)
    with losing_proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        # Given a worker (reaching the database through a path the test can cut) inside a long
        # model call, and a caller in another engine asking for the same key meanwhile
        worker = Engine(
            settings=fault_settings(
                proxy.url_for(server.url), step_lease_s=LEASE_S, operation_deadline_s=DEADLINE_S
            )
        )
        other = Engine(settings=fault_settings(server.url, step_lease_s=LEASE_S))
        worker.llm = ScriptedLlm(delay=MODEL_CALL_S)
        other.llm = ScriptedLlm()
        other.steps.wait_timeout_s = 0.05  # the caller polls itself, every 0.1 s
        caller = Caller(other)
        worked: list[object] = []

        def work() -> None:
            try:
                worked.append(asyncio.run(worker.process_step(SESSION, "x", INPUT, idempotency_key=KEY)))
            except Exception as error:
                worked.append(error)

        try:
            worker.start_session(SESSION, "wf")
            working = threading.Thread(target=work, daemon=True, name="worker")
            working.start()
            assert wait_until(lambda: renewals(server.url) >= 1, 3 * LEASE_S), "no renewal"
            caller.start()
            # When the worker's path goes down right after a renewal, until a renewal
            # attempt in the outage has failed (one period, then the deadline), and then
            # is back, the lease still running
            proxy.cut()
            cut_at = time.monotonic()
            time.sleep(PERIOD_S + DEADLINE_S + 0.2)
            proxy.mend()
            back_at = time.monotonic() - cut_at
            renewed = wait_until(lambda: renewals(server.url) >= 2, LEASE_S)
            renewed_at = time.monotonic() - cut_at
            # (past the lease as it stood at the cut, with time to spare)
            time.sleep(max(0.0, LEASE_S + 1.0 - (time.monotonic() - cut_at)))
            calls_while_alive = len(other.llm.calls)
            answered_while_alive = caller.answered_at is not None
            working.join(MODEL_CALL_S + 10)
            caller.join(10)  # answered with the worker's step
        finally:
            proxy.mend()
            caller.stop.set()
            caller.join(10)
            worker.close()
        history = other.history(SESSION)
        other.close()
    kinds = [entry.event_type.rsplit(".", 1)[-1] for entry in history]
    report(
        f"path back {back_at:.1f} s after the cut, renewed {renewed_at:.1f} s after it "
        f"(lease {LEASE_S} s); other caller's model calls {calls_while_alive}, answered while the "
        f"worker lived: {answered_while_alive}; events {kinds}"
    )
    # Then the worker renewed its lease soon after the path was back, before it lapsed
    assert renewed, "the worker never renewed its lease after the outage"
    assert renewed_at < LEASE_S - 0.5
    # And the caller elsewhere never called the model while the worker lived, nor took the step
    assert calls_while_alive == 0, f"the step was taken over while its worker lived: {kinds}"
    assert not answered_while_alive
    assert "StepFailed" not in kinds
    # And the worker's answer is the step, recorded once, which the other caller was given too
    assert kinds.count("StepProcessed") == 1
    assert len(worker.llm.calls) == 1
    assert caller.answered_at is not None
