"""An engine closed while a paid model answer is being saved in the background: close waits for
the save (within ``close_wait_s``), and an answer that comes after it is refused naming its key,
never handed to a saver that the closed engine would drop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flowledger.adapters.cli.errors import exit_code_for
from flowledger.adapters.http.errors import headers_for, status_for
from flowledger.domain import AnswerNotSaved, EngineClosed, StepInterrupted, StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.answer_savers import AnswerSavers
from tests.conftest import backend_engine, make_settings
from tests.support.llm import ScriptedLlm

LEASE_S = 30.0
OUTAGE = "the database did not answer (the test's outage)"


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from backend_engine(request, step_lease_s=LEASE_S)


def savers_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """The answer savers started since ``before`` that are still running."""
    return [
        thread
        for thread in threading.enumerate()
        if thread.name == "flowledger-answer-saver" and thread not in before and thread.is_alive()
    ]


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


class Outage:
    """The engine's store writes failing from ``begin()`` (the scripted model's answer) while
    ``down``; ``reached`` is set at the ``signal_after``-th failed write."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch, signal_after: int = 0) -> None:
        self.down = False
        self.failed = 0
        self.reached = threading.Event()
        write = engine.store.write

        def failing_write(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.failed += 1
                if self.failed == signal_after:
                    self.reached.set()
                raise StoreUnavailable("save", OUTAGE)
            return write(*args, **kwargs)

        monkeypatch.setattr(engine.store, "write", failing_write)

    def begin(self) -> None:
        self.down = True


async def test_an_answer_whose_save_fails_as_its_engine_closes_is_refused_naming_its_key(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (The save failed, the engine closed, and only then was the answer handed to a saver: the
    # caller was told it was being saved, and the saver met the closed engine and dropped it.)
    # Given a model that answers, and an engine that closes while the answer's save fails
    engine.start_session("s1", "cs")
    answered = False
    write = engine.store.write

    def write_as_the_engine_closes(*args: Any, **kwargs: Any) -> Any:
        if answered:
            engine.close()
            raise StoreUnavailable("save", OUTAGE)
        return write(*args, **kwargs)

    def answer() -> None:
        nonlocal answered
        answered = True

    monkeypatch.setattr(engine.store, "write", write_as_the_engine_closes)
    engine.llm = ScriptedLlm(meanwhile=answer)
    before = set(threading.enumerate())

    # When the step is processed
    with pytest.raises(AnswerNotSaved) as raised:
        await engine.process_step("s1", "greet", idempotency_key="k1")

    # Then the caller is told the answer was not saved, with the key to retry under, and no
    # saver was left running after the close
    assert isinstance(raised.value, EngineClosed)
    assert (raised.value.session_id, raised.value.idempotency_key) == ("s1", "k1")
    assert "'k1'" in str(raised.value)
    assert savers_started_since(before) == []


async def test_an_answer_that_comes_after_its_engine_closed_is_refused_naming_its_key(
    engine: Engine,
) -> None:
    # (The engine closed during the model call: the answer's save met the closed engine and the
    # caller got a bare EngineClosed, naming no key, although the model had been paid.)
    # Given a model that answers after its engine was closed
    engine.start_session("s1", "cs")
    engine.llm = ScriptedLlm(meanwhile=engine.close)
    # When the step is processed, with no key of the caller's
    with pytest.raises(AnswerNotSaved) as raised:
        await engine.process_step("s1", "greet")
    # Then the error names the key the step was begun under
    key = raised.value.idempotency_key
    assert key.startswith("step-")
    assert repr(key) in str(raised.value)


@pytest.mark.postgres
async def test_closing_an_engine_waits_for_an_answer_still_being_saved(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Close cancelled the saver between two tries, the database back: the paid answer was
    # never stored, and a retry of the key paid for it again.)
    # Given an answer whose saves fail, and a saver that has tried three times
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    engine = Engine(settings=settings)
    engine.start_session("s1", "cs")
    outage = Outage(engine, monkeypatch, signal_after=4)  # the caller's save, three of the saver's
    engine.llm = llm = ScriptedLlm(meanwhile=outage.begin)
    before = set(threading.enumerate())
    with pytest.raises(StoreUnavailable):
        await engine.process_step("s1", "greet", idempotency_key="k1")
    assert await asyncio.to_thread(outage.reached.wait, 30)

    # When the database is back and the engine is closed at once (the saver pausing 0.8 s)
    outage.down = False
    engine.close()

    # Then close returned with the answer saved and its saver ended: a new engine has the step
    assert savers_started_since(before) == []
    reopened = Engine(settings=settings)
    try:
        types = [t for t in event_types(reopened, "s1") if t != "StepLeaseRenewed"]
        assert types == ["Started", "StepStarted", "StepProcessed"]
        assert len(llm.calls) == 1
    finally:
        reopened.close()


async def test_closing_an_engine_gives_up_an_answer_it_cannot_save_within_its_bound_and_ends_its_saver(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an answer whose saves keep failing, and an engine that waits 0.2 s for it on close
    engine.start_session("s1", "cs")
    outage = Outage(engine, monkeypatch)
    monkeypatch.setattr(engine.steps, "close_wait_s", 0.2)
    engine.llm = ScriptedLlm(meanwhile=outage.begin)
    before = set(threading.enumerate())
    with pytest.raises(StoreUnavailable):
        await engine.process_step("s1", "greet", idempotency_key="k1")

    # When the engine is closed
    await asyncio.to_thread(engine.close)

    # Then its saver has ended by the time close returns
    assert savers_started_since(before) == []


@pytest.mark.parametrize(
    "error", [AnswerNotSaved("s1", "k1"), StepInterrupted("s1", "k1")], ids=["answered", "not yet"]
)
def test_a_step_interrupted_by_close_is_a_503_over_http_and_a_temporary_failure_on_the_command_line(
    error: StepInterrupted,
) -> None:
    # (As a bare EngineClosed it would be a 500 and exit 70: a bug, not to be retried, when a
    # retry under its key on an open engine is what gets the step done.)
    assert status_for(error) == 503
    assert headers_for(error) == {"Retry-After": "1"}
    assert exit_code_for(error) == 75


@pytest.mark.postgres
async def test_a_step_begun_as_its_engine_closes_is_refused_naming_its_key_before_any_model_call(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (StepStarted was saved, then the engine closed before the budget hold: the caller got a bare
    # EngineClosed naming no key, and the step, begun under a key it was never told, stayed
    # pending until another step reaped it as worker_lost.)
    # Given a budget (so a hold is taken after the step begins), and an engine that closes right
    # after the step's StepStarted is saved
    engine = pg_engine
    engine.start_session("s1", "cs")
    engine.budgets.set("tenant", None, "month", "100")
    write = engine.store.write

    def write_then_close(*args: Any, **kwargs: Any) -> Any:
        written = write(*args, **kwargs)
        engine.close()
        return written

    monkeypatch.setattr(engine.store, "write", write_then_close)
    engine.llm = llm = ScriptedLlm()

    # When a step is processed, with no key of the caller's
    with pytest.raises(StepInterrupted) as raised:
        await engine.process_step("s1", "greet")

    # Then no model was called, and the caller is told the key the step was begun under
    assert llm.calls == []
    assert not isinstance(raised.value, AnswerNotSaved)
    assert isinstance(raised.value, EngineClosed)
    key = raised.value.idempotency_key
    assert key.startswith("step-")
    assert repr(key) in str(raised.value)
    assert "before the model answered" in str(raised.value)


def refuse_saver_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads named as answer savers cannot start (a process out of threads); others can."""
    start = threading.Thread.start

    def refusing(thread: threading.Thread) -> None:
        if thread.name == "flowledger-answer-saver":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refusing)


def test_a_saver_whose_thread_cannot_start_is_not_left_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # (It stayed among the answers being saved: close waited out its whole bound for it.)
    savers = AnswerSavers()
    refuse_saver_threads(monkeypatch)

    async def save() -> None:
        return None

    with pytest.raises(RuntimeError):
        savers.start(save, "s1", "k1")
    assert savers.running == 0


async def test_an_answer_whose_saver_cannot_start_is_told_as_the_stores_error_not_as_being_saved(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (The caller got the bare RuntimeError "can't start new thread", no FlowledgerError.)
    # Given a model that answers while the saves fail, and no thread to save it later on
    engine.start_session("s1", "cs")
    engine.llm = ScriptedLlm(meanwhile=Outage(engine, monkeypatch).begin)
    refuse_saver_threads(monkeypatch)
    # When the step is processed
    with pytest.raises(StoreUnavailable) as raised:
        await engine.process_step("s1", "greet", idempotency_key="k1")
    # Then the caller is told the store's error, naming the key, and not that it is being saved
    assert "being saved" not in str(raised.value)
    assert "'k1'" in str(raised.value)
    assert OUTAGE in str(raised.value)
