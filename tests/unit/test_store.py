"""The one write path: exactly once under unknown commit outcomes, bounded retries, deadlines."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError, OperationalError

from flowledger.domain import ConcurrentUpdate, Session, StoreUnavailable
from flowledger.domain.aggregate import actor_of, command_id_of
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.engine.store import UnitOfWork
from flowledger.infrastructure.outages import within_deadline


def memory(**overrides: Any) -> Engine:
    return Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent"), **overrides))


@pytest.fixture
def engine() -> Iterator[Engine]:
    with memory(operation_deadline_s=2.0) as engine:
        yield engine


def fail_saves(engine: Engine, plan: list[str]) -> list[str]:
    """Replace the store's save: each call takes the next word of ``plan``.

    ``lost-reply``: the events are stored, then the caller hears an OperationalError (the
    commit's reply never arrived); ``refused``: nothing is stored and OperationalError is
    raised; ``ok``: a normal save. Returns the list of what happened, in order.
    """
    save: Callable[..., None] = engine.store._save
    happened: list[str] = []

    def faulty(uow: UnitOfWork, events: list[Any]) -> None:
        what = plan.pop(0) if plan else "ok"
        happened.append(what)
        if what == "refused":
            raise OperationalError("connection refused")
        save(uow, events)
        if what == "lost-reply":
            raise OperationalError("server closed the connection unexpectedly")

    engine.store._save = faulty  # type: ignore[method-assign]
    return happened


def processed(engine: Engine, session_id: str) -> list[Any]:
    return [
        e for e in engine.log.stream(engine.session_uuid(session_id)) if isinstance(e, Session.StepProcessed)
    ]


@pytest.mark.parametrize("key", [None, "pay-1"])
def test_a_lost_commit_reply_stores_the_step_once_and_acknowledges_it(
    engine: Engine, key: str | None
) -> None:
    # Given a session, and a save whose commit happens but whose reply is lost
    engine.start_session("s1", "cs")
    happened = fail_saves(engine, ["lost-reply"])
    # When a step is recorded (with or without a key)
    record = engine.record_step("s1", "pay", input={"n": 1}, idempotency_key=key)
    # Then the call succeeds, and the step is stored exactly once
    assert happened == ["lost-reply"]
    assert [e.input for e in processed(engine, "s1")] == [{"n": 1}]
    assert record.version == 2
    assert engine.get_session("s1").step_count == 1


def test_a_refused_save_is_retried_and_stores_the_step_once(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    happened = fail_saves(engine, ["refused", "refused"])
    engine.record_step("s1", "pay", input={"n": 1})
    assert happened == ["refused", "refused", "ok"]
    assert len(processed(engine, "s1")) == 1


def test_a_lost_reply_on_a_start_does_not_conflict_with_itself(engine: Engine) -> None:
    happened = fail_saves(engine, ["lost-reply"])
    state = engine.start_session("s1", "cs", user_id="u")
    assert happened == ["lost-reply"]
    assert state.version == 1
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started"]


def test_every_event_carries_the_id_of_the_command_that_wrote_it(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.record_step("s1", "a", idempotency_key="k-a")
    engine.record_step("s1", "b")
    started, a, b = engine.log.stream(engine.session_uuid("s1"))
    assert command_id_of(a) == "k-a"
    assert (command_id_of(started) or "").startswith("cmd-")
    assert (command_id_of(b) or "").startswith("cmd-")
    assert command_id_of(started) != command_id_of(b)


def test_a_database_that_stays_away_gives_store_unavailable_within_the_deadline() -> None:
    with memory(operation_deadline_s=0.5) as engine:
        engine.start_session("s1", "cs")
        fail_saves(engine, ["refused"] * 100)
        started = datetime.now(UTC)
        with pytest.raises(StoreUnavailable) as raised:
            engine.record_step("s1", "pay")
        # A generous bound (the deadline is 0.5 s): the machine may be loaded.
        assert datetime.now(UTC) - started < timedelta(seconds=10)
        assert raised.value.retry_after > 0
        assert processed(engine, "s1") == []


def test_conflicts_past_the_configured_bound_give_concurrent_update() -> None:
    # Given a store allowed 3 retries, whose every save loses the race
    with memory(max_conflict_retries=3) as engine:
        engine.start_session("s1", "cs")
        attempts = []

        def always_conflicts(uow: UnitOfWork, events: list[Any]) -> None:
            attempts.append(1)
            raise IntegrityError("duplicate key")

        engine.store._save = always_conflicts  # type: ignore[method-assign]
        with pytest.raises(ConcurrentUpdate) as raised:
            engine.record_step("s1", "pay")
        assert raised.value.attempts == 4
        assert len(attempts) == 4


def test_stamps_in_one_stream_never_go_back_even_when_the_clock_does() -> None:
    # Given an engine whose clock jumps back five minutes after the session starts
    now = [datetime(2030, 1, 1, 12, 0, tzinfo=UTC)]
    engine = Engine(
        settings=Settings(database_url="memory:", home=Path("/nonexistent")), clock=lambda: now[0]
    )
    engine.start_session("s1", "cs", ttl=timedelta(minutes=3))
    now[0] -= timedelta(minutes=5)
    # When a step is recorded
    engine.record_step("s1", "a")
    # Then its stamp is not earlier than the start's, and as_of finds the longest prefix
    stamps = [e.timestamp for e in engine.history("s1")]
    assert stamps == sorted(stamps)
    assert engine.get_session("s1", as_of=stamps[0]).version == 2
    engine.close()


def test_sixteen_threads_on_one_session_all_succeed(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(50):
                engine.record_step("s1", "step", input={"t": n, "i": i})
        except BaseException as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert engine.get_session("s1").step_count == 800


@pytest.fixture(params=["memory", "postgres"])
def either(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An in-memory engine, then one on PostgreSQL (this module's ``engine`` is in-memory only)."""
    if request.param == "memory":
        engine = memory()
        yield engine
        engine.close()
    else:
        yield request.getfixturevalue("pg_engine")


def test_a_key_older_than_the_recent_window_returns_its_step_not_a_second_one(either: Engine) -> None:
    # Given a session whose first keyed step lies far behind the 20 steps kept in state
    either.start_session("s1", "cs")
    first = either.record_step("s1", "pay", input={"n": 0}, idempotency_key='pay-0 \u00e9"quoted"')
    for n in range(1, 40):
        either.record_step("s1", "chat", input={"n": n}, idempotency_key=f"chat-{n}")
    # When the first call is retried
    again = either.record_step("s1", "pay", input={"n": 0}, idempotency_key='pay-0 \u00e9"quoted"')
    # Then the recorded step comes back and nothing is appended
    assert again == first
    assert either.get_session("s1").step_count == 40


def test_events_record_who_asked_for_them_when_an_actor_is_set(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    with engine.acting_as("key-7f3a"):
        engine.record_step("s1", "a")
    engine.record_step("s1", "b")
    started, a, b = engine.log.stream(engine.session_uuid("s1"))
    assert actor_of(a) == "key-7f3a"
    assert actor_of(started) is None
    assert actor_of(b) is None


def test_a_lost_commit_that_lands_after_the_retry_looked_answers_with_what_it_stored() -> None:
    # Given an engine whose clock ticks a second a reading, and a save whose statement was cut
    # off (the caller hears an error, nothing stored yet) but which the server finishes later,
    # after the retry looked for it and before the retry's own save
    ticks = iter(range(1_000))
    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    settings = Settings(database_url="memory:", home=Path("/nonexistent"), operation_deadline_s=5.0)
    with Engine(settings=settings, clock=lambda: start + timedelta(seconds=next(ticks))) as engine:
        save: Callable[..., None] = engine.store._save
        cut_off: list[tuple[UnitOfWork, list[Any]]] = []

        def late(uow: UnitOfWork, events: list[Any]) -> None:
            if not cut_off:
                cut_off.append((uow, events))
                raise OperationalError("server closed the connection unexpectedly")
            save(*cut_off[0])  # the first attempt commits now
            save(uow, events)

        engine.store._save = late  # type: ignore[method-assign]
        # When a session is started (its expiry reckoned from the clock when decided)
        answered = engine.start_session("s1", "cs", ttl=timedelta(hours=1))
        # Then the answer is the stored session's, not the one the retry decided and lost
        stored = engine.get_session("s1")
        assert [e.event_type for e in engine.history("s1")] == ["Session.Started"]
        assert answered.expires_at == stored.expires_at


def test_retries_after_an_outage_pause_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a write and a read that meet a database away five times each, their pauses counted
    # (each slept 0.2 s: writers cut off together by a restart came back in step, all at once)
    pauses: list[float] = []
    monkeypatch.setattr("flowledger.infrastructure.engine.store.time.sleep", pauses.append)
    monkeypatch.setattr("flowledger.infrastructure.outages.sleep", pauses.append)
    away = iter(range(5))

    def flaky_read() -> str:
        if next(away, None) is not None:
            raise OperationalError("connection refused")
        return "read"

    with memory(operation_deadline_s=10.0) as engine:
        engine.start_session("s1", "cs")
        fail_saves(engine, ["refused"] * 5)
        engine.record_step("s1", "pay")
        assert within_deadline("read", 5.0, flaky_read) == "read"
    # Then each pause lies around 0.2 s, and they are not all alike
    assert len(pauses) == 10
    assert all(0.1 <= pause <= 0.3 for pause in pauses)
    assert len(set(pauses[:5])) > 1
    assert len(set(pauses[5:])) > 1
