"""Two engines on one schema (two workers, as two processes would be) sharing a step's key:
a stalled worker taken over, and a caller in one engine waiting for the other's step."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from flowledger.domain.errors import LlmCallFailed
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm
from tests.support.steps import first_poll

pytestmark = pytest.mark.postgres
LEASE_S = 0.5


@pytest.fixture
def engines(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    """Two engines on one schema, with half-second leases."""
    settings = make_settings(database_url=database_url, schema=pg_schema, step_lease_s=LEASE_S)
    first, second = Engine(settings=settings), Engine(settings=settings)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


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
    # Given worker A whose process freezes inside its model call (its event loop blocked: no
    # lease renewals) until worker B has waited out A's lease and called the model itself
    first.llm = stalled = ScriptedLlm(error=late_end, meanwhile=lambda: took_over.wait(30))
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
    await asyncio.sleep(LEASE_S * 2)  # longer than a lease: B's renewals keep it live
    answer.set()
    b_record = await asyncio.wait_for(worker_b, 30)
    c_record = await asyncio.wait_for(caller_c, 30)

    # Then A recorded nothing under the key (its cost, when known, is kept under none), B's step
    # stood, and C waited for it: the model was called twice for the key, not three times
    assert polled.is_set()
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
