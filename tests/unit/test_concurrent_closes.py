"""Closes of one engine made at once (two threads, or ``aclose`` beside ``close``) are one close:
the later waits for the first to end, and a close after that does nothing.

Observed (an outside probe: 8 steps in flight, ``engine.close`` called from two threads at once):
the second close found nothing to give up, closed the store and returned while the first was
still recording the steps it gave up, so those records met the closed store ("this engine is
closed (save)"): three steps were left pending under their 30 s leases and their callers told so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flowledger.domain import StepInterrupted
from flowledger.infrastructure import Engine
from tests.conftest import backend_engine
from tests.support.llm import ScriptedLlm

HOLD_S = 0.5
"""How long the first close's record waits for the second close to return: on a close that
waits for the first, the whole of it (the second does not return meanwhile), never a race."""
HANG_S = 20.0


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from backend_engine(request, step_lease_s=30.0)


async def test_a_second_close_made_while_the_first_gives_up_steps_waits_for_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step in flight whose model has not answered
    engine.start_session("s1", "cs")
    called = asyncio.Event()
    engine.llm = ScriptedLlm(meanwhile=called.set, gate=asyncio.Event())
    step = asyncio.ensure_future(engine.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.wait_for(called.wait(), HANG_S)
    # and a first close whose record of it waits for a second close, made meanwhile, to return
    write, second_returned = engine.store.write, threading.Event()
    seconds: list[threading.Thread] = []

    def second_close() -> None:
        engine.close()
        second_returned.set()

    def write_after_a_second_close(*args: Any, **kwargs: Any) -> Any:
        if not seconds:
            seconds.append(threading.Thread(target=second_close))
            seconds[0].start()
            second_returned.wait(HOLD_S)
        return write(*args, **kwargs)

    monkeypatch.setattr(engine.store, "write", write_after_a_second_close)

    # When the engine closes (twice at once)
    await asyncio.to_thread(engine.close)
    await asyncio.to_thread(seconds[0].join, HANG_S)

    # Then the step was recorded given up before the store closed: its caller is told so
    assert second_returned.is_set()
    with pytest.raises(StepInterrupted) as raised:
        await asyncio.wait_for(step, HANG_S)
    assert raised.value.given_up, raised.value


async def test_an_aclose_beside_a_close_and_a_close_after_both_end_quietly(engine: Engine) -> None:
    # Given an engine with a session
    engine.start_session("s1", "cs")

    # When it is closed by close and aclose at once, then once more
    await asyncio.gather(asyncio.to_thread(engine.close), engine.aclose())
    engine.close()
    await engine.aclose()

    # Then it is closed
    with pytest.raises(Exception, match="closed"):
        engine.get_session("s1")
