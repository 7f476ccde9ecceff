"""An engine that closes while steps it began are in flight gives them up in the log: a step whose
model has not answered is cancelled and recorded as failed (``engine_closed``, no usage), so that
a retry under its key on another engine runs at once; a step whose model has answered is let
record its answer (the close waits for it), so that nobody calls the model for it again.

Observed (an outside probe: 8 threads in ``process_step`` against the simulator, then
``engine.close()``, then a fresh engine on the schema): 6-8 steps were left pending a run, and
each retry under its key waited out the whole lease and then called the model again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowledger.domain import AnswerNotSaved, StepInterrupted
from flowledger.domain.session_leases import ENGINE_CLOSED
from flowledger.infrastructure import Engine
from tests.conftest import backend_engine, make_settings
from tests.support.llm import ScriptedLlm

LEASE_S = 30.0
"""Far longer than any test runs: a retry that waited for the lease would fail (``wait_timeout_s`` 0)."""
HANG_S = 20.0
"""A bound on waits that end at once when the close does its part, so that a close that does not
fails the test instead of hanging it (the model never answers)."""


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from backend_engine(request, step_lease_s=LEASE_S)


def steps_of(engine: Engine, session_id: str) -> list[tuple[str, Any, Any]]:
    """The session's step events (renewals left out): type, idempotency key, error type."""
    return [
        (e.event_type.rsplit(".", 1)[-1], e.data.get("idempotency_key"), e.data.get("error_type"))
        for e in engine.history(session_id)
        if e.event_type.rsplit(".", 1)[-1] in {"StepStarted", "StepProcessed", "StepFailed"}
    ]


def unanswering_model() -> tuple[ScriptedLlm, asyncio.Event]:
    """A model that never answers, and an event set once it is called."""
    called = asyncio.Event()
    return ScriptedLlm(meanwhile=called.set, gate=asyncio.Event()), called


def hold_a_write_for_the_close(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, *, when: Callable[[], bool]
) -> threading.Event:
    """Hold the first write of ``engine``'s store made while ``when()`` is true until its close
    waits for it, or, a close that does not wait, has closed the store (so that the write meets
    the closed store: a write let go as the close began raced it, and won on the code that did
    not wait); return an event set once the write is held."""
    held, go_on = threading.Event(), threading.Event()
    write = engine.store.write

    def held_write(*args: Any, **kwargs: Any) -> Any:
        if not held.is_set() and when():
            held.set()
            go_on.wait(HANG_S)
        return write(*args, **kwargs)

    # The lock the close waits on for those steps (``StepAttempts.wait_answered``).
    changed = engine.steps._attempts._changed
    wait, close_store = changed.wait, engine.store.app.close

    def close_waits(timeout: float | None = None) -> bool:
        go_on.set()
        return wait(timeout)

    def store_closed() -> None:
        close_store()
        go_on.set()

    monkeypatch.setattr(engine.store, "write", held_write)
    monkeypatch.setattr(changed, "wait", close_waits)
    monkeypatch.setattr(engine.store.app, "close", store_closed)
    return held


async def test_a_step_whose_model_has_not_answered_at_close_is_given_up_and_runs_at_once_elsewhere(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two engines of one tenant over one store, and a step in flight on the first whose
    # model has not answered
    first, second = engine.for_tenant("t1"), engine.for_tenant("t1")
    first.start_session("s1", "cs")
    first.llm, called = unanswering_model()
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await called.wait()

    # When the first engine closes
    await asyncio.to_thread(first.close)

    # Then the caller is told the step was given up, naming its key
    with pytest.raises(StepInterrupted) as raised:
        await asyncio.wait_for(step, HANG_S)
    assert not isinstance(raised.value, AnswerNotSaved)
    assert (raised.value.idempotency_key, raised.value.given_up) == ("k1", True)
    assert "runs it at once" in str(raised.value)
    # and the log holds the attempt as failed by the close, with no usage
    failed = [e for e in second.history("s1") if e.event_type.endswith("StepFailed")]
    assert [(e.data["error_type"], e.data["usage"]) for e in failed] == [(ENGINE_CLOSED, None)]
    assert second.get_session("s1").pending == ()
    # and a retry under the key on the other engine runs at once, without waiting for the lease
    monkeypatch.setattr(second.steps, "wait_timeout_s", 0.0)
    second.llm = model = ScriptedLlm()
    record = await second.process_step("s1", "greet", idempotency_key="k1")
    assert record.idempotency_key == "k1"
    assert len(model.calls) == 1
    assert steps_of(second, "s1") == [
        ("StepStarted", "k1", None),
        ("StepFailed", "k1", ENGINE_CLOSED),
        ("StepStarted", "k1", None),
        ("StepProcessed", "k1", None),
    ]


async def test_a_caller_waiting_elsewhere_for_a_step_given_up_by_a_close_runs_it_itself(
    engine: Engine,
) -> None:
    # Given a step in flight on one engine, and a caller of its key waiting on another
    first, second = engine.for_tenant("t1"), engine.for_tenant("t1")
    first.start_session("s1", "cs")
    first.llm, called = unanswering_model()
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await called.wait()
    second.llm = model = ScriptedLlm()
    waiter = asyncio.ensure_future(second.process_step("s1", "greet", idempotency_key="k1"))

    # When the first engine closes
    await asyncio.to_thread(first.close)

    # Then the waiter runs the step itself (and is not told the first caller's interruption)
    record = await asyncio.wait_for(waiter, HANG_S)
    assert record.idempotency_key == "k1"
    assert len(model.calls) == 1
    with pytest.raises(StepInterrupted):
        await asyncio.wait_for(step, HANG_S)


@pytest.mark.postgres
async def test_no_step_in_flight_when_an_engine_closes_is_left_pending(
    database_url: str, pg_schema: str
) -> None:
    # Given eight steps in flight, on eight sessions, none answered yet
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    engine = Engine(settings=settings)
    sessions = [f"s{n}" for n in range(8)]
    for session_id in sessions:
        engine.start_session(session_id, "cs")
    gate, calls = asyncio.Event(), 0
    all_called = asyncio.Event()

    def count() -> None:
        nonlocal calls
        calls += 1
        if calls == len(sessions):
            all_called.set()

    engine.llm = ScriptedLlm(meanwhile=count, gate=gate)
    steps = [asyncio.ensure_future(engine.process_step(s, "greet")) for s in sessions]
    await all_called.wait()

    # When the engine closes
    await asyncio.to_thread(engine.close)

    # Then every caller is told its step was given up, and a fresh engine finds none pending
    outcomes = await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), HANG_S)
    assert all(isinstance(o, StepInterrupted) and o.given_up for o in outcomes), outcomes
    with Engine(settings=settings) as fresh:
        assert [len(fresh.get_session(s).pending) for s in sessions] == [0] * len(sessions)
        assert all(steps_of(fresh, s)[-1][2] == ENGINE_CLOSED for s in sessions)


@pytest.mark.postgres
async def test_a_step_whose_answer_is_being_recorded_when_its_engine_closes_is_recorded(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step whose model answered and whose answer's save is under way as the engine
    # closes, held until the close waits for it (or, a close that does not, has closed the store)
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    engine = Engine(settings=settings)
    engine.start_session("s1", "cs")
    answered = threading.Event()
    saving = hold_a_write_for_the_close(engine, monkeypatch, when=answered.is_set)
    engine.llm = model = ScriptedLlm(meanwhile=answered.set)
    step = asyncio.ensure_future(engine.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(saving.wait, HANG_S)

    # When the engine closes
    await asyncio.to_thread(engine.close)

    # Then the answer was recorded before the store closed, and the caller has it
    record = await asyncio.wait_for(step, HANG_S)
    assert record.idempotency_key == "k1"
    with Engine(settings=settings) as fresh:
        assert [t for t, _, _ in steps_of(fresh, "s1")] == ["StepStarted", "StepProcessed"]
        assert len(model.calls) == 1


def test_a_step_interrupted_says_whether_its_retry_runs_at_once_or_after_the_lease() -> None:
    given_up = StepInterrupted("s1", "k1", given_up=True)
    left = StepInterrupted("s1", "k1")
    assert "runs it at once" in str(given_up)
    assert "lease" not in str(given_up)
    assert "once its lease lapses" in str(left)


async def test_a_step_whose_start_is_being_saved_when_its_engine_closes_is_given_up_too(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Seen by an outside probe, 8 steps against a 5 ms simulator and a close soon after: one
    # caller in a few runs got StepInterrupted without given_up, its step left pending, and the
    # retry waited out the 15 s lease: its StepStarted was saved after the close had begun, and
    # its failure could no longer be recorded on the closing engine.)
    # Given a step whose StepStarted is being saved, on another thread, as the engine closes,
    # held until the close waits for it
    engine.start_session("s1", "cs")
    saving = hold_a_write_for_the_close(engine, monkeypatch, when=lambda: True)
    engine.llm = model = ScriptedLlm()
    step = asyncio.ensure_future(engine.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(saving.wait, HANG_S)

    # When the engine closes
    await asyncio.to_thread(engine.close)

    # Then the step was given up in the log before the store closed, and no model was called
    with pytest.raises(StepInterrupted) as raised:
        await asyncio.wait_for(step, HANG_S)
    assert raised.value.given_up
    assert model.calls == []


@pytest.mark.postgres
async def test_a_step_whose_start_is_being_saved_when_its_own_loop_closes_the_engine_is_given_up(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Seen by an outside probe, 8 steps in a loop against a 5 ms model and engine.close() called
    # on that loop: one step left pending under its 30 s lease, its caller told given_up false.
    # The close cannot wait for its own loop, and its StepStarted, saved on a database thread,
    # was only registered once the loop ran again, the store closed by then.)
    # Given a step whose StepStarted is being saved on a database thread
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    engine = Engine(settings=settings)
    engine.start_session("s1", "cs")
    saving = hold_a_write_for_the_close(engine, monkeypatch, when=lambda: True)
    engine.llm = model = ScriptedLlm()
    step = asyncio.ensure_future(engine.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(saving.wait, HANG_S)

    # When the engine is closed from the step's own event loop
    engine.close()

    # Then the step was given up in the log, its caller told so, and no model was called
    with pytest.raises(StepInterrupted) as raised:
        await asyncio.wait_for(step, HANG_S)
    assert raised.value.given_up
    assert model.calls == []
    with Engine(settings=settings) as fresh:
        assert steps_of(fresh, "s1") == [("StepStarted", "k1", None), ("StepFailed", "k1", ENGINE_CLOSED)]


@pytest.mark.postgres
async def test_a_step_whose_answer_is_being_saved_when_its_own_loop_closes_the_engine_is_recorded(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Seen by an outside probe, 8 steps in a loop against a 5 ms model and engine.close() called
    # on that loop: one step left pending under its 30 s lease, its caller told AnswerNotSaved
    # given_up false: the close cannot wait for its own loop, nor did it for the answer's save
    # under way on a database thread, and closed the store under it.)
    # Given a step whose answer's save is under way on a database thread
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    engine = Engine(settings=settings)
    engine.start_session("s1", "cs")
    answered = threading.Event()
    saving = hold_a_write_for_the_close(engine, monkeypatch, when=answered.is_set)
    engine.llm = ScriptedLlm(meanwhile=answered.set)
    step = asyncio.ensure_future(engine.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(saving.wait, HANG_S)

    # When the engine is closed from the step's own event loop
    engine.close()

    # Then the answer was recorded before the store closed, and the caller has it
    record = await asyncio.wait_for(step, HANG_S)
    assert record.idempotency_key == "k1"
    with Engine(settings=settings) as fresh:
        assert [t for t, _, _ in steps_of(fresh, "s1")] == ["StepStarted", "StepProcessed"]
