"""Concurrent writers on real PostgreSQL: no step lost, none doubled, conflicts bounded."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from flowledger.domain import ConcurrentUpdate, IdempotencyKeyReused, Session
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.conftest import make_settings

ENGINES = 4
THREADS = 16


@pytest.fixture
def engines(database_url: str, pg_schema: str) -> Iterator[list[Engine]]:
    """Four engines on one schema, default settings: like four processes, each with its own lock and pool."""
    group = [
        Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) for _ in range(ENGINES)
    ]
    yield group
    for engine in group:
        engine.close()


def test_sixteen_threads_recording_fifty_steps_each_lose_nothing(engines: list[Engine]) -> None:
    # Given one session
    engines[0].start_session("busy", "cs")

    # When 16 threads in 4 engines each record 50 steps on it
    def writer(thread: int) -> None:
        engine = engines[thread % ENGINES]
        for n in range(50):
            engine.record_step(
                "busy", f"t{thread}", input={"n": n}, output={}, idempotency_key=f"{thread}-{n}"
            )

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(writer, range(THREADS)))

    # Then every step is there once, versions contiguous
    history = engines[1].history("busy")
    processed = [e for e in history if e.event_type == "Session.StepProcessed"]
    assert len(processed) == 800
    assert [e.version for e in history] == list(range(1, 802))
    keys = {e.data["idempotency_key"] for e in processed}
    assert len(keys) == 800
    assert engines[2].get_session("busy").step_count == 800


def test_sixteen_engines_writing_one_session_at_once_never_see_concurrent_update(
    database_url: str, pg_schema: str
) -> None:
    # Given 16 engines (like 16 processes: no shared lock) with the default conflict bound
    group = [Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) for _ in range(16)]
    group[0].start_session("hot", "cs")

    # When each records 25 steps on the same session at the same time
    def writer(n: int) -> int:
        for i in range(25):
            group[n].record_step("hot", "answer", input={"w": n, "i": i})
        return n

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(writer, range(16)))
        # Then all 400 are recorded once each: conflicts were retried with jittered backoff
        state = group[0].get_session("hot")
        assert state.step_count == 400
        inputs = {(r.input["w"], r.input["i"]) for r in group[1].session_steps("hot")}
        assert len(inputs) == 400
    finally:
        for engine in group:
            engine.close()


def test_sixteen_threads_posting_one_idempotency_key_record_one_step(engines: list[Engine]) -> None:
    engines[0].start_session("dup", "cs")

    def post(thread: int) -> int:
        engine = engines[thread % ENGINES]
        return engine.record_step("dup", "pay", output={"paid": True}, idempotency_key="pay-1").version

    with ThreadPoolExecutor(THREADS) as pool:
        versions = set(pool.map(post, range(THREADS)))

    assert versions == {2}
    assert [e.event_type for e in engines[0].history("dup")] == ["Session.Started", "Session.StepProcessed"]


def test_sixteen_threads_posting_one_key_with_different_payloads_record_one_and_refuse_the_rest(
    engines: list[Engine],
) -> None:
    engines[0].start_session("dup", "cs")

    def post(thread: int) -> str:
        engine = engines[thread % ENGINES]
        try:
            engine.record_step("dup", "pay", output={"by": thread}, idempotency_key="pay-1")
        except IdempotencyKeyReused as refused:
            return refused.differs
        return str(thread)

    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(post, range(THREADS)))
    winners = [int(answer) for answer in answers if answer != "output"]

    # One payload is recorded, once; every other thread is told its payload was not
    assert len(winners) == 1
    (stored,) = engines[0].get_session("dup").history
    assert stored.output == {"by": winners[0]}
    assert len(engines[1].history("dup")) == 2


@pytest.mark.parametrize("retries", [0, 2])
def test_a_writer_that_keeps_losing_the_race_gets_concurrent_update(
    database_url: str, pg_schema: str, retries: int
) -> None:
    # Given two engines, the first allowed a number of retries
    loser = Engine(
        settings=make_settings(database_url=database_url, schema=pg_schema, max_conflict_retries=retries)
    )
    winner = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    loser.start_session("race", "cs")
    attempts: list[int] = []

    # When another writer commits while each of the loser's attempts is in flight
    def slow_step(uow: UnitOfWork) -> None:
        session: Session = uow.find(loser.session_uuid("race"))
        attempts.append(session.version)
        winner.record_step("race", "interloper")
        session.record_step(step="mine", input={}, output={})

    with pytest.raises(ConcurrentUpdate) as raised:
        loser.store.write("race", slow_step)

    # Then it gave up after 1 + retries attempts, each against fresh state, and wrote nothing
    assert raised.value.attempts == retries + 1
    # and the error names the bound and how to raise it
    assert raised.value.bound == retries
    assert f"max_conflict_retries, {retries}: FLOWLEDGER_MAX_CONFLICT_RETRIES" in str(raised.value)
    assert attempts == list(range(1, retries + 2))
    steps = [r.step for r in winner.get_session("race").history]
    assert steps == ["interloper"] * (retries + 1)
    loser.close()
    winner.close()


def test_a_writer_whose_cached_session_went_stale_retries_against_fresh_state(
    engines: list[Engine],
) -> None:
    # Given engine 0 has the session cached after writing to it
    first, other = engines[0], engines[1]
    first.start_session("stale", "cs")
    first.record_step("stale", "a", idempotency_key="k-a")

    # When another process records a step and then the same key engine 0 is about to use
    other.record_step("stale", "b", context_update={"from": "other"}, idempotency_key="k-b")
    with pytest.raises(IdempotencyKeyReused, match="already names step 'b'"):
        first.record_step("stale", "b-again", idempotency_key="k-b")
    replayed = first.record_step("stale", "b", context_update={"from": "other"}, idempotency_key="k-b")
    first.record_step("stale", "c", idempotency_key="k-c")

    # Then engine 0 saw the other's step: no duplicate key, nothing lost
    assert (replayed.step, replayed.version) == ("b", 3)
    state = other.get_session("stale")
    assert [r.step for r in state.history] == ["a", "b", "c"]
    assert state.context == {"from": "other"}


def test_sixteen_threads_starting_one_session_write_one_started_event(engines: list[Engine]) -> None:
    def start(thread: int) -> str:
        return engines[thread % ENGINES].start_session("fresh", "cs", user_id="u").workflow

    with ThreadPoolExecutor(THREADS) as pool:
        workflows = list(pool.map(start, range(THREADS)))

    assert workflows == ["cs"] * THREADS
    assert [e.event_type for e in engines[0].history("fresh")] == ["Session.Started"]
