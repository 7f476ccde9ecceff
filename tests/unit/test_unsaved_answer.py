"""A model answer the store would not take (an outage past the deadline) is not paid for twice:
its worker keeps saving it, holding the step's lease, and a retry of the key gets it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowledger.domain.errors import ConcurrentUpdate, StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import backend_engine, make_settings
from tests.support.llm import USAGE, ScriptedLlm

LEASE_S = 1.0


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine with one-second leases, on each backend."""
    yield from backend_engine(request, step_lease_s=LEASE_S)


class Outage:
    """Every save of ``engine`` fails with StoreUnavailable (as past the operation deadline),
    or with ``error()`` when given, from the moment the model is first called until ``end``."""

    def __init__(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch, error: Callable[[], Exception] | None = None
    ) -> None:
        self.down = False
        self.over = asyncio.Event()
        write = engine.store.write

        def failing_write(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                if error is not None:
                    raise error()
                raise StoreUnavailable("save", "the database did not answer (the test's outage)")
            return write(*args, **kwargs)

        monkeypatch.setattr(engine.store, "write", failing_write)

    def begin(self) -> None:
        self.down = not self.over.is_set()  # one outage: a second model call meets none

    def end(self) -> None:
        self.down = False
        self.over.set()


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            StoreUnavailable("save", "the database did not answer (the test's outage)"), id="outage"
        ),
        # every save losing its race to other writers past max_conflict_retries (a
        # FlowledgerError, not an outage): the step stayed pending until its lease lapsed
        pytest.param(ConcurrentUpdate("s1", 4, 3), id="lost races"),
    ],
)
async def test_an_answer_whose_save_failed_is_saved_later_and_a_retry_gets_it_without_a_second_call(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    # Given a model that answers while the database stops taking saves
    engine.start_session("s1", "cs")
    outage = Outage(engine, monkeypatch, error=lambda: failure)
    engine.llm = llm = ScriptedLlm(meanwhile=outage.begin)

    # When the answer cannot be saved, the caller is told so at once (503 for an outage)
    began = time.monotonic()
    with pytest.raises(type(failure)):
        await engine.process_step("s1", "greet", idempotency_key="k1")
    assert time.monotonic() - began < LEASE_S
    # and the database comes back a moment later, and the caller retries the key
    asyncio.get_running_loop().call_later(0.3, outage.end)
    await outage.over.wait()
    record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), 30)

    # Then the retry gets the answer the model gave (and was paid for) the first time: the model
    # was called once, and no attempt was lost (the retry used to wait out the lease, record
    # worker_lost with no usage and call the model again, the first answer's cost in no event)
    assert len(llm.calls) == 1
    assert record.usage == USAGE
    types = [t for t in event_types(engine, "s1") if t != "StepLeaseRenewed"]
    assert types == ["Started", "StepStarted", "StepProcessed"]
    assert engine.get_session("s1").pending == ()


async def test_a_caller_whose_answer_is_still_being_saved_is_told_its_outcome_is_unknown_and_the_key(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model that answers while the database stops taking saves, and a caller with no key
    engine.start_session("s1", "cs")
    outage = Outage(engine, monkeypatch)
    engine.llm = llm = ScriptedLlm(meanwhile=outage.begin)

    # When the answer cannot be saved at once
    with pytest.raises(StoreUnavailable) as raised:
        await engine.process_step("s1", "greet")
    outage.end()

    # Then the error says the outcome is unknown (its worker saves the answer in the
    # background: an outside probe saw such steps stored with the error saying nothing of it)
    # and names the key the step is saved under, so a retry does not pay for a second call
    assert raised.value.outcome_unknown
    [started] = [e for e in engine.history("s1") if e.event_type.endswith("StepStarted")]
    key = started.data["idempotency_key"]
    assert repr(key) in str(raised.value)
    record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key=key), 30)
    assert len(llm.calls) == 1
    assert record.usage == USAGE


@pytest.mark.postgres
async def test_a_settlement_whose_reply_was_lost_is_not_counted_twice_when_the_answer_is_saved_later(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a budget, and a ledger whose first settlement commits and then loses its reply
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S))
    try:
        engine.start_session("s1", "cs")
        engine.budgets.set("session", "s1", "total", "100")
        engine.llm = llm = ScriptedLlm()
        settle = engine.budgets.settle
        lost_replies = [StoreUnavailable("settle", "the reply to the commit was lost")]

        def settle_then_lose_the_reply(*args: Any, **kwargs: Any) -> Any:
            raised = settle(*args, **kwargs)
            if lost_replies:
                raise lost_replies.pop()
            return raised

        monkeypatch.setattr(engine.budgets, "settle", settle_then_lose_the_reply)

        # When the step's caller is told the store is unavailable, and retries the key
        with pytest.raises(StoreUnavailable):
            await engine.process_step("s1", "greet", idempotency_key="k1")
        record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), 30)

        # Then the answer was saved by its worker and its cost counted once
        assert len(llm.calls) == 1
        assert record.usage == USAGE
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (USAGE.charged_usd, 0)
    finally:
        await engine.aclose()
        engine.close()


def test_an_answer_whose_save_failed_is_saved_though_the_callers_event_loop_has_ended(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A script calling ``asyncio.run(engine.process_step(...))`` for each step: the answer's
    # background save was a task of the caller's loop, cancelled when asyncio.run ended it. The
    # step stayed pending, the retry waited out the lease, recorded worker_lost with the cost
    # unknown and called the model again: the first answer, paid for, was in no event.)
    # Given a model that answers while the database stops taking saves
    engine.start_session("s1", "cs")
    outage = Outage(engine, monkeypatch)
    engine.llm = llm = ScriptedLlm(meanwhile=outage.begin)
    # When the caller is told the save failed, and its event loop ends with the call
    with pytest.raises(StoreUnavailable):
        asyncio.run(engine.process_step("s1", "greet", idempotency_key="k1"))
    # and the database comes back
    outage.end()
    # Then the answer is saved all the same, and a retry in a loop of its own gets it
    deadline = time.monotonic() + 10
    while "StepProcessed" not in event_types(engine, "s1") and time.monotonic() < deadline:
        time.sleep(0.05)
    record = asyncio.run(asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), 30))
    assert len(llm.calls) == 1
    assert record.usage == USAGE
    types = [t for t in event_types(engine, "s1") if t != "StepLeaseRenewed"]
    assert types == ["Started", "StepStarted", "StepProcessed"]


async def test_a_save_whose_outcome_was_already_unknown_still_names_the_key_its_answer_is_saved_under(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A connection cut during the outcome's commit: the store's own error already said the
    # outcome was unknown, "retry with the same idempotency key", and was passed on as it was,
    # naming no key, to a caller that gave none: its retry without one paid for a second call.)
    # Given a model that answers while the outcome's save is cut mid-commit, and no key given
    engine.start_session("s1", "cs")
    cut = StoreUnavailable("save", "server closed the connection unexpectedly", outcome_unknown=True)
    outage = Outage(engine, monkeypatch, error=lambda: cut)
    engine.llm = llm = ScriptedLlm(meanwhile=outage.begin)
    with pytest.raises(StoreUnavailable) as raised:
        await engine.process_step("s1", "greet")
    outage.end()
    # Then the error names the generated key, once, and a retry under it gets the answer
    assert raised.value.outcome_unknown
    [started] = [e for e in engine.history("s1") if e.event_type.endswith("StepStarted")]
    key = started.data["idempotency_key"]
    assert repr(key) in str(raised.value)
    assert str(raised.value).count("outcome of the save is unknown") == 1
    record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key=key), 30)
    assert len(llm.calls) == 1
    assert record.usage == USAGE
