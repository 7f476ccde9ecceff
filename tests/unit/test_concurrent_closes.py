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

from flowledger.domain import EngineClosed, StepInterrupted
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


async def test_a_caller_waiting_for_a_key_held_elsewhere_is_told_its_engine_closed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (An outside probe: a caller of a tenant's engine waiting for a step another engine held
    # went on polling after its engine closed, until the holder ended or wait_timeout_s, 120 s.)
    # Given a step in flight on one engine of a tenant, and a caller of its key waiting on another
    first, second = engine.for_tenant("t1"), engine.for_tenant("t1")
    first.start_session("s1", "cs")
    called = asyncio.Event()
    first.llm = ScriptedLlm(meanwhile=called.set, gate=asyncio.Event())
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.wait_for(called.wait(), HANG_S)
    second.llm = model = ScriptedLlm()
    monkeypatch.setattr(second.steps, "wait_timeout_s", 2.0)  # StepInProgress, not a hang, when not told
    polled = threading.Event()
    get = second.steps._sessions.get

    def polled_get(*args: Any, **kwargs: Any) -> Any:
        polled.set()
        return get(*args, **kwargs)

    monkeypatch.setattr(second.steps._sessions, "get", polled_get)
    waiter = asyncio.ensure_future(second.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(polled.wait, HANG_S)

    # When the waiter's engine closes
    await asyncio.to_thread(second.close)

    # Then the waiter is told its engine closed (within a poll), and calls no model
    with pytest.raises(EngineClosed) as raised:
        await asyncio.wait_for(waiter, HANG_S)
    assert not isinstance(raised.value, StepInterrupted)
    assert model.calls == []
    await asyncio.to_thread(first.close)
    with pytest.raises(StepInterrupted):
        await asyncio.wait_for(step, HANG_S)
