"""Requests that queue for a worker thread during an outage are answered within their deadline
counted from arrival; a slow but healthy server's queue is not turned into 503s.

An outside probe (``flowledger serve``, a 3 s operation deadline, the database stopped, 100
requests at once): each request's deadline began only once it had one of the 40 worker
threads, so the answers took up to 9.2 s (median 6.2 s), three deadlines.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx
import pytest

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from tests.faults.ledger import engine_after_an_outage
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
DEADLINE_S = 1.5
REQUESTS = 100
"""More than twice the app's worker threads (40): the last ones wait two deadlines for one."""


class Burst(NamedTuple):
    """What ``REQUESTS`` reads sent at once met."""

    slowest: float
    """The longest any took, from its sending to its answer (s)."""
    statuses: list[int]
    retry_after: set[str | None]
    stalled: float
    """The longest the event loop was held up (s): a machine that stalled the test process
    (clean-clone runs share two cores) delays every answer by that, whatever the app does."""


async def burst(engine: Engine) -> Burst:
    transport = httpx.ASGITransport(app=create_app(engine, require_keys=False))
    stalled = 0.0
    done = asyncio.Event()

    async def watch_the_loop() -> None:
        nonlocal stalled
        while not done.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            stalled = max(stalled, time.monotonic() - before - 0.01)

    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:

        async def timed() -> tuple[float, httpx.Response]:
            started = time.monotonic()
            answer = await client.get("/v1/sessions/s")
            return time.monotonic() - started, answer

        watcher = asyncio.create_task(watch_the_loop())
        answers = await asyncio.gather(*(timed() for _ in range(REQUESTS)))
        done.set()
        await watcher
    return Burst(
        max(took for took, _ in answers),
        sorted({a.status_code for _, a in answers}),
        {a.headers.get("retry-after") for _, a in answers},
        stalled,
    )


# Its time bound alone is tried once more (see the Makefile's RERUN_ON): a clean-clone run once
# answered in 17.5 s, never reproduced (1.55-1.76 s here, under coverage and CPU burners); the
# defect it guards (three deadlines, 4.5 s) fails both tries, and a wrong status is not retried.
@pytest.mark.flaky(reruns=1, only_rerun=[r"^AssertionError: assert [0-9.e+-]+ < "])
def test_requests_queued_for_a_thread_in_an_outage_are_answered_within_a_deadline_of_arriving(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given an app whose engine has read a session, and then a database that stopped
    server = private_postgres()
    with engine_after_an_outage(server, DEADLINE_S) as engine:
        # When more requests than there are worker threads arrive at once
        met = asyncio.run(burst(engine))
    report(
        f"{REQUESTS} requests answered {met.statuses} in at most {met.slowest:.2f} s "
        f"(deadline {DEADLINE_S:g} s; the event loop held up {met.stalled:.2f} s at most)"
    )
    # Then every one is told the store is unavailable within about one deadline (not three, as
    # the last of 100 requests on 40 threads waited before: 4.5 s here). Alone it takes 1.7 s;
    # a clean-clone run beside five other test sessions took 3.25 s, so the bound is 2.5 of them,
    # plus the longest the machine held the test's event loop up (a clean-clone run's 17.5 s
    # came with no other figure to tell a stall from waits in the app, whose threads wait
    # without holding the loop)
    assert met.statuses == [503]
    assert met.retry_after == {"1"}
    assert met.slowest < 2.5 * DEADLINE_S + met.stalled


def test_a_slow_but_healthy_store_after_an_outage_keeps_its_queue(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given an engine that met an outage, a database back, and reads that each take 0.5 s
    server = private_postgres()
    with engine_after_an_outage(server, DEADLINE_S) as engine:
        assert asyncio.run(burst(engine)).statuses == [503]
        server.start()
        engine.get_session("s")
        reads = engine.get_session

        def slow_read(*args: Any, **kwargs: Any) -> Any:
            session = reads(*args, **kwargs)
            time.sleep(0.5)
            return session

        engine.get_session = slow_read  # type: ignore[method-assign]
        # When more requests than there are worker threads arrive at once (the last wait 1 s)
        met = asyncio.run(burst(engine))
    report(f"{REQUESTS} slow reads answered {met.statuses} in at most {met.slowest:.2f} s")
    # Then every one is answered, however long it queued
    assert met.statuses == [200]
    assert met.slowest >= DEADLINE_S - 0.5  # the last ones did queue
