"""Two engines on one schema stand in for two servers: a classify of one task through each at
once makes one model call, not one each (issue #14: two ``serve`` processes made two paid
calls, the second recorded as ``ClassificationDiscarded``). The task's advisory lock
(``postgres/classification_locks.py``) is held through the call and the save; it is only an
optimisation, so a holder that stalls delays nobody past ``lock_wait_s``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from uuid import UUID

import psycopg
import pytest

from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.classification_locks import ClassificationLocks
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm

FEATURE = json.dumps({"category": "feature", "complexity": "high", "estimated_hours": 6})


@pytest.fixture
def two_servers(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    one, other = (Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) for _ in "ab")
    yield one, other
    one.close()
    other.close()


def event_names(engine: Engine, task_id: str) -> list[str]:
    return [event.event_type.split(".")[-1] for event in engine.task_history(task_id)]


def lock_key(engine: Engine, pg_schema: str, task_id: str) -> int:
    locks = ClassificationLocks("unused", pg_schema, None)  # type: ignore[arg-type]
    return locks.key(task_uuid(engine.tenant, task_id))


async def test_a_classify_through_each_of_two_servers_at_once_makes_one_call(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a task, and a model behind each server that takes a while to answer
    one.create_task("t1", "Add OAuth login", [])
    one.llm = first = ScriptedLlm(FEATURE, delay=0.2)
    other.llm = second = ScriptedLlm(FEATURE, delay=0.2)

    # When both servers classify it at once, three callers each
    states = await asyncio.gather(*(engine.classify_task("t1") for engine in (one, other) * 3))

    # Then one model call was made in all, and every caller got the same classification
    assert len(first.calls) + len(second.calls) == 1
    assert all(state.classification == states[0].classification for state in states)
    assert states[0].classification is not None
    assert event_names(one, "t1") == ["Created", "Classified"]


async def test_a_reclassify_through_each_of_two_servers_at_once_makes_one_call(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a classified task, and a model behind each server that takes a while to answer
    one.create_task("t1", "Add OAuth login", [])
    one.llm = first = ScriptedLlm(FEATURE, delay=0.2)
    other.llm = second = ScriptedLlm(FEATURE, delay=0.2)
    await one.classify_task("t1")
    first.calls.clear()

    # When both servers reclassify it at once on the same model, three callers each
    states = await asyncio.gather(
        *(engine.reclassify_task("t1", "deepseek-v3.2") for engine in (one, other) * 3)
    )

    # Then one model call was made in all, one reclassification recorded, and every caller
    # got the same task
    assert len(first.calls) + len(second.calls) == 1
    assert event_names(one, "t1") == ["Created", "Classified", "Classified"]
    assert all(state.classification == states[0].classification for state in states)


async def test_reclassifies_on_different_models_through_two_servers_each_make_their_call(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a classified task
    one.create_task("t1", "Add OAuth login", [])
    one.llm = first = ScriptedLlm(FEATURE, delay=0.2)
    other.llm = second = ScriptedLlm(FEATURE, delay=0.2)
    await one.classify_task("t1")
    first.calls.clear()

    # When the servers reclassify it at once, each on a model of its own
    await asyncio.gather(
        one.reclassify_task("t1", "deepseek-v3.2"), other.reclassify_task("t1", "gemini-2.5-flash")
    )

    # Then each made its call and both were applied, as in one engine
    assert [call.model for call in first.calls + second.calls] == ["deepseek-v3.2", "gemini-2.5-flash"]
    assert event_names(one, "t1") == ["Created", "Classified", "Classified", "Classified"]


async def test_a_classify_waits_for_a_stalled_holder_no_longer_than_its_bound(
    database_url: str, pg_schema: str, request: pytest.FixtureRequest
) -> None:
    # Given a server whose classifications wait at most 0.3 s for another's (the setting), and a
    # task whose lock another session holds and does not let go (a stalled process)
    settings = make_settings(database_url=database_url, schema=pg_schema, classify_lock_wait_s=0.3)
    one = Engine(settings=settings)
    request.addfinalizer(one.close)
    one.create_task("t1", "Add OAuth login", [])
    one.llm = llm = ScriptedLlm(FEATURE)
    with psycopg.connect(database_url, autocommit=True) as stalled:
        stalled.execute(f"SELECT pg_advisory_lock({lock_key(one, pg_schema, 't1')})")
        # When the task is classified
        began = time.monotonic()
        state = await one.classify_task("t1")
        waited = time.monotonic() - began
    # Then it waited for the bound, then classified it anyway
    assert 0.3 <= waited < 5
    assert len(llm.calls) == 1
    assert state.classification is not None


async def test_a_classify_goes_ahead_as_soon_as_the_holder_is_gone(
    two_servers: tuple[Engine, Engine], database_url: str, pg_schema: str
) -> None:
    one, _ = two_servers
    # Given a task whose lock a process holds, and that process dies soon (its session ends)
    one.create_task("t1", "Add OAuth login", [])
    one.llm = llm = ScriptedLlm(FEATURE)
    with psycopg.connect(database_url, autocommit=True) as stalled:
        stalled.execute(f"SELECT pg_advisory_lock({lock_key(one, pg_schema, 't1')})")
        asyncio.get_running_loop().call_later(0.2, stalled.close)

        # When the task is classified
        began = time.monotonic()
        state = await one.classify_task("t1")

    # Then it went ahead once the holder's session ended, long before its bound
    assert time.monotonic() - began < one.classifier.lock_wait_s / 2
    assert len(llm.calls) == 1
    assert state.classification is not None


@pytest.mark.parametrize("outcome", ["answered", "cancelled"])
async def test_the_lock_is_let_go_after_a_classify_answered_or_cancelled(
    two_servers: tuple[Engine, Engine], database_url: str, pg_schema: str, outcome: str
) -> None:
    one, _ = two_servers
    # Given a classify of a task, answered or cancelled during the model call
    one.create_task("t1", "Add OAuth login", [])
    gate = asyncio.Event()
    one.llm = llm = ScriptedLlm(FEATURE, gate=gate)
    call = asyncio.create_task(one.classify_task("t1"))
    while not llm.calls:
        await asyncio.sleep(0.01)
    if outcome == "answered":
        gate.set()
        await call
    else:
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    # When another session asks for the task's lock (once the release has reached the server)
    with psycopg.connect(database_url, autocommit=True) as elsewhere:
        for _ in range(100):
            row = elsewhere.execute(
                f"SELECT pg_try_advisory_lock({lock_key(one, pg_schema, 't1')})"
            ).fetchone()
            if row is not None and row[0]:
                break
            await asyncio.sleep(0.02)
        # Then it gets it
        assert row is not None
        assert row[0] is True


async def test_a_classify_that_read_the_task_before_another_server_classified_it_makes_no_call(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a task, and a server whose classify has read it (not classified yet) and is slow to
    # ask for its lock: the other server's whole classify (lock, call, save, unlock) fits in
    # between, so the lock is free when it asks (two serve processes running the queue at once
    # made two paid calls so, the second recorded as ClassificationDiscarded)
    one.create_task("t1", "Add OAuth login", [])
    one.llm = first = ScriptedLlm(FEATURE)
    other.llm = second = ScriptedLlm(FEATURE)
    asked, free = threading.Event(), threading.Event()
    locks = other.classifier.locks
    assert locks is not None
    take = locks.try_lock

    def slow_try_lock(task_id: UUID, purpose: str = "classify") -> bool | None:
        asked.set()
        free.wait(10)
        return take(task_id, purpose)

    locks.try_lock = slow_try_lock  # type: ignore[method-assign]
    late = asyncio.create_task(other.classify_task("t1"))
    while not asked.is_set():
        await asyncio.sleep(0.01)
    classified = await one.classify_task("t1")
    free.set()

    # When the slow server gets the lock, free by then
    state = await late

    # Then it answers the other server's classification, with no call of its own
    assert (len(first.calls), len(second.calls)) == (1, 0)
    assert state.classification == classified.classification
    assert event_names(one, "t1") == ["Created", "Classified"]
