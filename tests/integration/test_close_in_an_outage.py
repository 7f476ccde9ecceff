"""An engine that closes while PostgreSQL is unreachable cannot record the steps it gives up:
its close still ends within its bounds (``close_wait_s`` for its waits, as long again for its
records), logs which sessions and keys are left to their leases, and tells their callers that a
retry takes the step over once its lease lapses (not that it runs at once).

Observed (an outside probe: 3 steps in flight, the path to PostgreSQL cut, then ``close``): the
close took 45.03 s (each record waited out the 15 s operation deadline), logged nothing, and
each caller was told the step was given up and its retry would run at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import pytest

from flowledger.domain import StepInterrupted
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.faults.proxy import losing_proxy
from tests.support.bounded import SLACK_S
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres
CLOSE_WAIT_S = 0.3
DEADLINE_S = 3.0
"""Each record's own deadline: a close bounded by it alone takes 6 s for the two steps."""
HANG_S = 20.0


async def test_a_close_with_the_database_cut_off_ends_in_time_and_names_the_steps_left_to_their_leases(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = urlsplit(database_url)
    with losing_proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        settings = make_settings(
            database_url=proxy.url_for(database_url),
            schema=pg_schema,
            step_lease_s=30.0,
            operation_deadline_s=DEADLINE_S,
        )
        # Given two steps in flight whose models have not answered
        engine = Engine(settings=settings)
        engine.steps.close_wait_s = CLOSE_WAIT_S
        for session_id in ("s0", "s1"):
            engine.start_session(session_id, "cs")
        called = 0
        both_called = asyncio.Event()

        def count() -> None:
            nonlocal called
            called += 1
            if called == 2:
                both_called.set()

        engine.llm = ScriptedLlm(meanwhile=count, gate=asyncio.Event())
        steps = [
            asyncio.ensure_future(engine.process_step(s, "greet", idempotency_key=f"k{s[1]}"))
            for s in ("s0", "s1")
        ]
        await asyncio.wait_for(both_called.wait(), HANG_S)

        # When the path to PostgreSQL is cut and the engine closes
        proxy.cut()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="flowledger"):
            await asyncio.to_thread(engine.close)
        took = time.monotonic() - started

        # Then the close ends within its bounds, and says which steps are left to their leases
        assert took < 2 * CLOSE_WAIT_S + SLACK_S, took
        warnings = [
            r.getMessage() for r in caplog.records if "left" in r.getMessage() or "lease" in r.getMessage()
        ]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        for words in (
            "2 step(s)",
            "session 's0' key 'k0'",
            "session 's1' key 'k1'",
            "until its lease lapses",
        ):
            assert words in warnings[0], warnings[0]
        # and each caller is told its retry takes the step over once the lease lapses
        outcomes = await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), HANG_S)
        for outcome in outcomes:
            assert isinstance(outcome, StepInterrupted), outcome
            assert not outcome.given_up
            assert "once its lease lapses" in str(outcome)

        # and, the path back, a fresh engine finds both steps pending under their leases
        proxy.mend()
        fresh = Engine(settings=settings)
        try:
            assert [[p.idempotency_key for p in fresh.get_session(s).pending] for s in ("s0", "s1")] == [
                ["k0"],
                ["k1"],
            ]
        finally:
            fresh.close()
