"""``/healthz`` answers at once during an outage, however many requests wait for the database:
it needs no worker thread.

An outside probe (``flowledger serve``, a 3 s operation deadline, the database stopped, 100
requests at once): every worker thread waited out its deadline in the engine and /healthz,
queued behind them for a thread, answered after 5.4 s, long past an orchestrator's liveness
timeout (1 s by default in Kubernetes), which would restart a process that was well.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from tests.faults.ledger import engine_after_an_outage
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
DEADLINE_S = 2.0
WAITING = 60
"""More requests than the app's worker threads (40)."""


async def burst_then_probe(engine: Engine) -> tuple[float, int, list[int]]:
    transport = httpx.ASGITransport(app=create_app(engine, require_keys=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        waiting = [asyncio.ensure_future(client.get("/v1/sessions/s")) for _ in range(WAITING)]
        await asyncio.sleep(0.3)  # every worker thread is taken by now
        started = time.monotonic()
        probe = await client.get("/healthz")
        took = time.monotonic() - started
        answers = await asyncio.gather(*waiting)
    return took, probe.status_code, sorted({answer.status_code for answer in answers})


def test_healthz_answers_at_once_while_every_worker_thread_waits_for_the_database(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given an app whose engine has read a session, and then a database that stopped
    server = private_postgres()
    with engine_after_an_outage(server, DEADLINE_S) as engine:
        # When more requests than there are worker threads wait for it, and /healthz is asked
        took, status, others = asyncio.run(burst_then_probe(engine))
    report(f"/healthz answered {status} in {took:.2f} s beside {WAITING} requests answered {others}")
    # Then it answers at once, while the others are told the store is unavailable
    assert status == 200
    assert took < 0.5
    assert others == [503]
