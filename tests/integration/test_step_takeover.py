"""Two engines on one schema (two workers, as two processes would be) sharing a step's key:
a stalled worker taken over, and a caller in one engine waiting for the other's step."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from flowledger.adapters.http.errors import status_for
from flowledger.domain.errors import CircuitOpen, FlowledgerError, LlmCallFailed, UnknownModelPrice
from flowledger.domain.session_views import StepRecord
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine import step_failures
from tests.support.llm import ScriptedLlm
from tests.support.steps import first_poll
from tests.support.two_engines import two_engines

pytestmark = pytest.mark.postgres
LEASE_S = 2.0
"""Short enough to wait out once; long enough that a loaded machine still renews in time."""


@pytest.fixture
def engines(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    """Two engines on one schema, with two-second leases."""
    with two_engines(database_url, pg_schema, LEASE_S) as pair:
        yield pair


def keyed(engine: Engine, session_id: str, key: str) -> list[tuple[str, object]]:
    """The session's step events under ``key`` (lease renewals left out), as (type, error_type)."""
    return [
        (entry.event_type.rsplit(".", 1)[-1], entry.data.get("error_type"))
        for entry in engine.history(session_id)
        if entry.data.get("idempotency_key") == key and "Lease" not in entry.event_type
    ]


def run_in_thread(coroutine: object) -> tuple[threading.Thread, list[BaseException | object]]:
    """Run ``coroutine`` on an event loop of its own thread; its result or error lands in the list."""
    ended: list[BaseException | object] = []

    async def run() -> None:
        try:
            ended.append(await coroutine)  # type: ignore[misc]
        except BaseException as error:  # reported by the test
            ended.append(error)

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    return thread, ended


LATE_FAILURE = LlmCallFailed(
    "HTTP 500",
    error_type="http_500",
    attempts=1,
    usage=LlmUsage(request_model="deepseek-v3.2", response_id="stalled", latency_ms=5000.0),
)


@pytest.mark.parametrize("late_end", [LATE_FAILURE, asyncio.CancelledError()], ids=["failed", "cancelled"])
async def test_a_stalled_worker_that_fails_late_leaves_the_step_of_the_worker_that_took_it_over(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch, late_end: BaseException
) -> None:
    first, second = engines
    first.start_session("s1", "cs")
    took_over = threading.Event()
    # Given worker A whose process freezes inside its model call (its event loop blocked, and
    # its renewals, which run off the loop, frozen too, as in a stopped process) until worker
    # B has waited out A's lease and called the model itself
    first.llm = stalled = ScriptedLlm(error=late_end, meanwhile=lambda: took_over.wait(30))
    monkeypatch.setattr(first.steps, "_renewer", lambda *_, **__: SimpleNamespace(stop=lambda: None))
    answer = asyncio.Event()
    second.llm = taker = ScriptedLlm(meanwhile=took_over.set, gate=answer)
    worker_a, a_ended = run_in_thread(first.process_step("s1", "greet", idempotency_key="k"))
    while not stalled.calls:
        await asyncio.sleep(0.01)
    worker_b = asyncio.create_task(second.process_step("s1", "greet", idempotency_key="k"))

    # When A wakes and its call ends (an HTTP 500, or its caller cancelled) while B's renewed
    # lease runs, and a third caller then asks for the key
    await asyncio.to_thread(worker_a.join, 30)
    [a_end] = a_ended
    assert isinstance(a_end, type(late_end)), a_end
    polled = first_poll(first, monkeypatch)
    caller_c = asyncio.create_task(first.process_step("s1", "greet", idempotency_key="k"))
    while not (polled.is_set() or caller_c.done()):  # waiting for B's step, or not
        await asyncio.sleep(0.01)
    answer.set()
    b_record = await asyncio.wait_for(worker_b, 30)
    c_record = await asyncio.wait_for(caller_c, 30)

    # Then A recorded nothing under the key (its cost, when known, is kept under none), B's step
    # stood, and C waited for it: the model was called twice for the key, not three times
    assert (len(stalled.calls), len(taker.calls)) == (1, 1)
    assert c_record == b_record
    assert keyed(first, "s1", "k") == [
        ("StepStarted", None),
        ("StepFailed", "worker_lost"),
        ("StepStarted", None),
        ("StepProcessed", None),
    ]
    state = first.get_session("s1")
    assert state.pending == ()
    unkeyed = [f for f in state.failures if f.idempotency_key is None]
    if isinstance(late_end, LlmCallFailed):
        [kept] = unkeyed
        assert kept.error_type == "superseded"
        assert "http_500" in kept.error_message
        assert kept.usage == late_end.usage
    else:
        assert unkeyed == []  # a cancel before any answer: nothing known to keep


async def leader_and_waiter(
    first: Engine, second: Engine, monkeypatch: pytest.MonkeyPatch, began: Callable[[], bool]
) -> tuple[asyncio.Task[StepRecord], asyncio.Task[StepRecord]]:
    """A step led by ``first`` (until ``began`` says it is under way) and a caller of ``second``
    waiting for it under the same key (it has read the pending step once)."""
    leader = asyncio.create_task(first.process_step("s1", "greet", idempotency_key="k"))
    while not began():
        await asyncio.sleep(0.01)
    polled = first_poll(second, monkeypatch)
    waiter = asyncio.create_task(second.process_step("s1", "greet", idempotency_key="k"))
    assert await asyncio.to_thread(polled.wait, 30)
    return leader, waiter


async def test_a_waiter_in_another_engine_runs_the_step_itself_when_the_first_caller_is_cancelled(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a caller of one engine inside its model call, and a caller of another engine
    # waiting for the same key
    first, second = engines
    first.start_session("s1", "cs")
    first.llm = hung = ScriptedLlm(gate=asyncio.Event())
    second.llm = own = ScriptedLlm()
    leader, waiter = await leader_and_waiter(first, second, monkeypatch, lambda: bool(hung.calls))

    # When the first caller is cancelled (a timeout around process_step)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader

    # Then the waiter runs the step itself, as a waiter in the same process does: the first
    # caller's cancel says nothing about the request (it used to reach the waiter as a 502)
    record = await asyncio.wait_for(waiter, 30)
    assert record.idempotency_key == "k"
    assert (len(hung.calls), len(own.calls)) == (1, 1)
    assert keyed(first, "s1", "k") == [
        ("StepStarted", None),
        ("StepFailed", "cancelled"),
        ("StepStarted", None),
        ("StepProcessed", None),
    ]


def gated_llm(error: BaseException | None = None) -> ScriptedLlm:
    return ScriptedLlm(error=error, gate=asyncio.Event())


def model_answers(engine: Engine) -> None:
    llm = engine.llm
    assert isinstance(llm, ScriptedLlm)
    assert llm.gate is not None
    llm.gate.set()


def circuit_open(
    first: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], bool], Callable[[], None]]:
    first.llm = llm = gated_llm(CircuitOpen("http://model.test/v1", 12.0))
    return lambda: bool(llm.calls), partial(model_answers, first)


def model_failed(
    first: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], bool], Callable[[], None]]:
    first.llm = llm = gated_llm(LlmCallFailed("HTTP 503", error_type="http_503", attempts=3, status_code=503))
    return lambda: bool(llm.calls), partial(model_answers, first)


def model_unpriced(
    first: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], bool], Callable[[], None]]:
    first.llm = llm = gated_llm(UnknownModelPrice("mystery-model", "v1"))
    return lambda: bool(llm.calls), partial(model_answers, first)


def session_closed(
    first: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], bool], Callable[[], None]]:
    first.llm = llm = gated_llm()

    def closed_then_answered() -> None:
        first.complete_session("s1", "done elsewhere")
        model_answers(first)

    return lambda: bool(llm.calls), closed_then_answered


def budget_exceeded(
    first: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], bool], Callable[[], None]]:
    # A spent session budget: the reservation refuses the call before any request.
    first.llm = ScriptedLlm()
    first.budgets.set("session", "s1", "total", "0.01")
    spent = LlmUsage(request_model="deepseek-v3.2", cost_usd=Decimal("0.02"))
    first.record_step("s1", "earlier", output={}, usage=spent)
    reserving, go_on = threading.Event(), threading.Event()
    reserve = first.budgets.reserve

    def held_reserve(*args: Any, **kwargs: Any) -> Any:
        reserving.set()
        go_on.wait(30)
        return reserve(*args, **kwargs)

    monkeypatch.setattr(first.budgets, "reserve", held_reserve)
    return reserving.is_set, go_on.set


@pytest.mark.parametrize(
    "fails",
    [circuit_open, model_failed, model_unpriced, session_closed, budget_exceeded],
    ids=lambda f: f.__name__,
)
async def test_a_waiter_in_another_engine_gets_the_error_class_the_first_caller_got(
    engines: tuple[Engine, Engine],
    monkeypatch: pytest.MonkeyPatch,
    fails: Callable[[Engine, pytest.MonkeyPatch], tuple[Callable[[], bool], Callable[[], None]]],
) -> None:
    # Given a caller of one engine whose step will fail, and a caller of another engine waiting
    # for the same key, which rebuilds the error from its recorded fields, never its message
    def unread(*args: object) -> None:
        raise AssertionError("the waiter parsed the failure's message")

    monkeypatch.setattr(step_failures, "_from_message", unread)
    first, second = engines
    first.start_session("s1", "cs")
    second.llm = own = ScriptedLlm()
    began, fail = fails(first, monkeypatch)
    leader, waiter = await leader_and_waiter(first, second, monkeypatch, began)

    # When the first caller's step fails
    await asyncio.to_thread(fail)
    with pytest.raises(FlowledgerError) as first_error:
        await asyncio.wait_for(leader, 30)

    # Then the waiter gets an error of the same class, so the same HTTP status (402, 503, 422,
    # 409 reached it as a 502), with the same message and attributes, and calls no model
    with pytest.raises(FlowledgerError) as waiter_error:
        await asyncio.wait_for(waiter, 30)
    assert type(waiter_error.value) is type(first_error.value)
    assert status_for(waiter_error.value) == status_for(first_error.value)
    if not isinstance(first_error.value, CircuitOpen):  # its "next trial in" has moved on
        assert str(waiter_error.value) == str(first_error.value)
    assert vars(waiter_error.value).keys() == vars(first_error.value).keys()
    assert {k: v for k, v in vars(waiter_error.value).items() if k != "retry_in_s"} == {
        k: v for k, v in vars(first_error.value).items() if k != "retry_in_s"
    }
    assert own.calls == []
