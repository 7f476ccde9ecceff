"""process_step cancelled at every await point, and the paths by which a step is recovered.

Cancellation: the engine's database work runs on an inline executor here, so every hop
completes in a known number of event-loop turns and "cancel after the k-th turn", for
each k until the call completes unhindered, reaches every await point of the call
(before StepStarted, during its save, inside the model call, during the final save).
Recovery: a waiter takes over from a cancelled in-process leader; a step that failed in
another worker is reported to its waiter; a lease that lapses while a caller waits is
taken over. Each runs on both backends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest

from flowledger.domain.errors import LlmCallFailed
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.support.llm import ScriptedLlm
from tests.support.steps import first_poll, start_elsewhere

T = TypeVar("T")

CANCELLED_OUTCOMES = (
    ["Started"],  # cancelled before its first step ran
    ["Started", "StepStarted", "StepFailed"],  # cancelled with the step begun: closed as cancelled
    ["Started", "StepStarted", "StepProcessed"],  # cancelled after the step was saved
)


class InlineExecutor(Executor):
    """Runs each submitted function at once, on the caller's thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:
            future.set_exception(error)
        return future


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


async def run_cancelled_after(engine: Engine, session_id: str, turns: int) -> bool:
    """Run one step, cancelling it after ``turns`` loop turns; True when it finished first."""
    call = asyncio.create_task(engine.process_step(session_id, "greet", idempotency_key="k1"))
    for _ in range(turns):
        await asyncio.sleep(0)
    if call.done():
        await call
        return True
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    return False


async def cancel_at_every_turn(engine: Engine) -> tuple[set[tuple[str, ...]], int]:
    """One session per loop turn ``k``, its step cancelled after ``k`` turns, until a step
    completes first; each left with no pending step and events in ``CANCELLED_OUTCOMES``.
    The outcomes seen, and the sessions (``s0`` .. ``s<n>``) made."""
    seen: set[tuple[str, ...]] = set()
    turns = 0
    while True:
        session_id = f"s{turns}"
        engine.start_session(session_id, "cs")
        # When the caller is cancelled after ``turns`` turns of the loop
        finished = await run_cancelled_after(engine, session_id, turns)
        # Then the step is never left pending: it failed as cancelled, or it was recorded
        state = engine.get_session(session_id)
        types = event_types(engine, session_id)
        assert state.pending == (), (turns, types)
        assert types in CANCELLED_OUTCOMES, (turns, types)
        if "StepFailed" in types:
            assert [f.error_type for f in state.failures] == ["cancelled"]
        seen.add(tuple(types))
        if finished:
            return seen, turns + 1
        turns += 1
        assert turns < 200, "the call never completed"


async def test_a_caller_cancelled_at_any_await_point_leaves_no_pending_step(engine: Engine) -> None:
    # Given an engine whose database hops complete inline, and a model that yields three times
    engine.steps.executor = InlineExecutor()
    engine.llm = llm = ScriptedLlm(yields=3)
    seen, _ = await cancel_at_every_turn(engine)
    # And every kind of cancellation point was reached on the way
    assert seen == {tuple(t) for t in CANCELLED_OUTCOMES}
    assert len(llm.calls) >= 3


@pytest.mark.postgres
async def test_with_a_budget_a_caller_cancelled_at_any_await_point_leaves_no_pending_step_or_unbooked_cost(
    pg_engine: Engine,
) -> None:
    # Given a budget (so the model's answer is settled in the ledger before the step is saved:
    # one more await point between the paid answer and its StepProcessed)
    engine = pg_engine
    engine.steps.executor = InlineExecutor()
    engine.llm = llm = ScriptedLlm(yields=3)
    engine.budgets.set("tenant", None, "month", "100")
    seen, sessions = await cancel_at_every_turn(engine)
    # And the ledger holds nothing and charged exactly what the events record
    [burn] = engine.budgets.burn()
    assert burn.reserved_usd == Decimal(0)
    states = [engine.get_session(f"s{n}") for n in range(sessions)]
    records = [r for state in states for r in (*state.history, *state.failures) if r.usage is not None]
    assert burn.spent_usd == sum((r.usage.charged_usd for r in records), Decimal(0))
    assert len(llm.calls) >= 3
    assert ("Started", "StepStarted", "StepProcessed") in seen


async def test_a_waiter_takes_over_the_step_when_its_in_process_leader_is_cancelled(engine: Engine) -> None:
    # Given a leader whose model call hangs, and a second caller with the same key waiting on it
    engine.llm = llm = ScriptedLlm(delay=60)
    engine.start_session("s1", "cs")
    leader = asyncio.create_task(engine.process_step("s1", "greet", idempotency_key="k1"))
    while not llm.calls:
        await asyncio.sleep(0.01)
    waiter = asyncio.create_task(engine.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.sleep(0)
    assert len(llm.calls) == 1

    # When the leader is cancelled
    llm.delay = 0
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader

    # Then the waiter starts the step afresh and records it; the leader's attempt is on the books
    record = await asyncio.wait_for(waiter, timeout=60)
    assert record.idempotency_key == "k1"
    assert len(llm.calls) == 2
    types = event_types(engine, "s1")
    assert types == ["Started", "StepStarted", "StepFailed", "StepStarted", "StepProcessed"]
    assert [f.error_type for f in engine.get_session("s1").failures] == ["cancelled"]


async def test_a_step_that_fails_in_another_worker_fails_its_waiter_with_that_error(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step another worker started under a live lease, and a caller waiting for it
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "cs")
    start_elsewhere(engine, "s1", "k1", timedelta(minutes=5))
    polled = first_poll(engine, monkeypatch)
    waiter = asyncio.create_task(engine.process_step("s1", "greet", idempotency_key="k1"))
    assert await asyncio.to_thread(polled.wait, 60)

    # When that worker records the step as failed
    spent = LlmUsage(request_model="gpt-4.1", attempts=3, cost_usd=Decimal("0.0012"), latency_ms=900.0)

    def fail(uow: UnitOfWork) -> None:
        uow.find(engine.session_uuid("s1")).fail_step(
            step="greet", error_type="http_503", error_message="HTTP 503", usage=spent, idempotency_key="k1"
        )

    await asyncio.to_thread(engine.store.write, "s1", fail)

    # Then the waiter raises that failure, with its type, attempts and usage, and calls no model
    with pytest.raises(LlmCallFailed, match="HTTP 503") as raised:
        await asyncio.wait_for(waiter, timeout=60)
    assert (raised.value.error_type, raised.value.attempts, raised.value.usage) == ("http_503", 3, spent)
    assert llm.calls == []
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepFailed"]


async def test_a_lease_that_lapses_while_a_caller_waits_is_taken_over(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step held by a worker that will never finish, with a lease of one second
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "cs")
    start_elsewhere(engine, "s1", "k1", timedelta(seconds=1))

    # When a caller asks for the same key (it waits while the lease is live)
    record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), timeout=60)

    # Then once the lease lapsed it recorded the lost attempt and ran the step itself
    assert record.idempotency_key == "k1"
    assert len(llm.calls) == 1
    state = engine.get_session("s1")
    assert state.pending == ()
    [lost] = state.failures
    assert lost.error_type == "worker_lost"
    # The worker named once: it read "the lease of worker W lapsed (worker W, lease until ...)"
    assert lost.error_message.startswith("the worker's lease lapsed (worker elsewhere, lease until ")
    assert lost.error_message.count("elsewhere") == 1
    types = event_types(engine, "s1")
    assert types == ["Started", "StepStarted", "StepFailed", "StepStarted", "StepProcessed"]
