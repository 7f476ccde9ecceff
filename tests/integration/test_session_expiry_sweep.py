"""A session whose expiry passed with nobody touching it: read as expired now, recorded as
``Expired`` by the sweep (once, whoever runs it), and so counted expired by the read models."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.domain.session import Session
from flowledger.domain.session_views import SessionStatus
from flowledger.infrastructure import Engine
from flowledger.projections.expiry import expire_overdue
from flowledger.projections.registry import projector_for
from tests.conftest import make_settings
from tests.support.clock import SetClock


def expired_events(engine: Engine, session_id: str) -> int:
    """How many ``Expired`` events the session's stream holds."""
    events = engine.store.events(engine.sessions.session_uuid(session_id))
    return sum(isinstance(e, Session.Expired) for e in events)


def test_a_lapsed_session_reads_expired_now_but_active_at_its_versions(
    clocked_engine: Engine, clock: SetClock
) -> None:
    clocked_engine.start_session("s", "wf", ttl=timedelta(minutes=3))
    assert clocked_engine.get_session("s").status is SessionStatus.ACTIVE

    clock.now += timedelta(minutes=3)  # the expiry is the first moment it is expired

    assert clocked_engine.get_session("s").status is SessionStatus.EXPIRED
    assert clocked_engine.get_session("s", version=1).status is SessionStatus.ACTIVE  # a fact of the past
    assert expired_events(clocked_engine, "s") == 0  # reads never write


def test_the_sweep_records_expired_once_and_leaves_live_and_closed_sessions(
    clocked_engine: Engine, clock: SetClock
) -> None:
    for sid in ("old-1", "old-2"):
        clocked_engine.start_session(sid, "wf", ttl=timedelta(minutes=5))
    clocked_engine.start_session("live", "wf", ttl=timedelta(hours=2))
    clocked_engine.start_session("done", "wf", ttl=timedelta(minutes=5))
    clocked_engine.complete_session("done")
    clocked_engine.start_session("extended", "wf", ttl=timedelta(minutes=5))
    projector = projector_for(clocked_engine)
    projector.catch_up()
    clocked_engine.change_expiry("extended", by=timedelta(hours=1))  # after the read model saw it

    clock.now += timedelta(minutes=10)
    sweep = expire_overdue(clocked_engine, projector)

    assert sorted(sweep.expired) == ["old-1", "old-2"]
    assert sweep.complete
    names = ("old-1", "old-2", "live", "done", "extended")
    assert [expired_events(clocked_engine, sid) for sid in names] == [1, 1, 0, 0, 0]
    again = expire_overdue(clocked_engine, projector)
    assert again.expired == []
    assert again.examined == 0
    with projector.connect_reader() as conn:
        query = f'SELECT session_id, status FROM "{projector.names.reader}".sessions'
        rows = dict(conn.execute(query).fetchall())
    assert rows == {
        "old-1": "expired",
        "old-2": "expired",
        "live": "active",
        "done": "completed",
        "extended": "active",
    }


def test_a_limit_cuts_a_sweep_and_says_so(clocked_engine: Engine, clock: SetClock) -> None:
    for n in range(5):
        clocked_engine.start_session(f"s{n}", "wf", ttl=timedelta(minutes=1 + n))
    clock.now += timedelta(hours=1)
    projector = projector_for(clocked_engine)

    first = expire_overdue(clocked_engine, projector, limit=3)
    second = expire_overdue(clocked_engine, projector, limit=3)

    assert first.expired == ["s0", "s1", "s2"]
    assert not first.complete
    assert second.expired == ["s3", "s4"]
    assert second.complete


def test_two_sweeps_at_once_record_each_expiry_once(
    database_url: str, pg_schema: str, clock: SetClock
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings, clock=clock) as a, Engine(settings=settings, clock=clock) as b:
        for n in range(30):
            a.start_session(f"s{n}", "wf", ttl=timedelta(minutes=1))
        clock.now += timedelta(minutes=2)
        results: list[list[str]] = []
        barrier = threading.Barrier(2)

        def sweep(engine: Engine) -> None:
            projector = projector_for(engine)
            projector.catch_up()
            barrier.wait()
            results.append(expire_overdue(engine, projector).expired)

        threads = [threading.Thread(target=sweep, args=(e,)) for e in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

        assert sorted(results[0] + results[1]) == sorted(f"s{n}" for n in range(30))
        assert all(expired_events(a, f"s{n}") == 1 for n in range(30))


def test_expire_session_judges_the_session_itself_on_both_backends(engine: Engine) -> None:
    engine.start_session("short", "wf", ttl=timedelta(milliseconds=1))
    engine.start_session("long", "wf", ttl=timedelta(hours=1))
    deadline = engine.get_session("short").expires_at
    while engine.clock() < deadline:
        threading.Event().wait(0.005)

    assert engine.expire_session("short") is True
    assert engine.expire_session("short") is False  # recorded once
    assert engine.expire_session("long") is False
    assert engine.get_session("short").status is SessionStatus.EXPIRED
    assert engine.get_session("long").status is SessionStatus.ACTIVE
    assert expired_events(engine, "short") == 1
    assert expired_events(engine, "long") == 0


def test_the_sweep_needs_postgresql() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    with engine, pytest.raises(ValidationError, match="PostgreSQL"):
        expire_overdue(engine, projector_for(engine))


def test_a_read_as_of_a_moment_after_the_expiry_reads_expired_as_a_read_now_does(
    clocked_engine: Engine, clock: SetClock
) -> None:
    # Given a session whose expiry passed with nothing recorded since
    clocked_engine.start_session("s", "wf", ttl=timedelta(minutes=3))
    started = clock.now
    clock.now += timedelta(minutes=10)

    # Then a read as of now, or of any moment past the expiry, agrees with the read now
    assert clocked_engine.get_session("s").status is SessionStatus.EXPIRED
    assert clocked_engine.get_session("s", as_of=clock.now).status is SessionStatus.EXPIRED
    past_expiry = started + timedelta(minutes=5)
    assert clocked_engine.get_session("s", as_of=past_expiry).status is SessionStatus.EXPIRED
    # And a moment before the expiry, or a moment still to come read as now, as before
    before = started + timedelta(minutes=1)
    assert clocked_engine.get_session("s", as_of=before).status is SessionStatus.ACTIVE
    assert expired_events(clocked_engine, "s") == 0  # reads never write


def test_starting_an_overdue_session_again_answers_it_expired(
    clocked_engine: Engine, clock: SetClock
) -> None:
    # Given a session whose expiry passed with nothing recorded since
    clocked_engine.start_session("s", "wf", ttl=timedelta(minutes=3))
    clock.now += timedelta(minutes=10)

    # When it is started again with the same workflow (REST POST /v1/sessions: 200, unchanged)
    again = clocked_engine.start_or_get_session("s", "wf")

    # Then it is answered as a read answers it: expired, not active
    assert not again.created
    assert again.state.status is SessionStatus.EXPIRED
    assert again.state == clocked_engine.get_session("s")


def test_a_sweep_gets_past_what_it_expired_though_the_replicas_read_model_lags(
    database_url: str, pg_schema: str, clock: SetClock
) -> None:
    # Given overdue sessions, and a read database whose read model stopped where a follower left
    # it (a replica replaying nothing more: here the same database, which nobody catches up)
    writer_settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=writer_settings, clock=clock) as writer:
        for n in range(5):
            writer.start_session(f"s{n}", "wf", ttl=timedelta(minutes=1 + n))
        projector_for(writer).catch_up()
    clock.now += timedelta(hours=1)
    settings = make_settings(database_url=database_url, schema=pg_schema, read_database_url=database_url)
    with Engine(settings=settings, clock=clock) as engine:
        # When sweeps of two run one after another
        sweeps = [expire_overdue(engine, projector_for(engine), limit=2) for _ in range(3)]

        # Then each takes the next two overdue sessions, and every one is recorded once
        assert [s.expired for s in sweeps] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
        assert sweeps[-1].complete
        assert [expired_events(engine, f"s{n}") for n in range(5)] == [1] * 5


def test_an_erased_session_is_expired_by_the_sweep_with_nothing_personal(
    database_url: str, pg_schema: str, clock: SetClock, quick_purge: None
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings, clock=clock) as engine:
        engine.start_session("gone", "wf", user_id="alice", ttl=timedelta(minutes=1))
        engine.forget("alice")
        clock.now += timedelta(minutes=2)

        swept = expire_overdue(engine, projector_for(engine))

        assert swept.expired == ["gone"]
        names = [type(e).__name__ for e in engine.store.events(engine.sessions.session_uuid("gone"))]
        assert names[-2:] == ["DataErased", "Expired"]
        assert expire_overdue(engine, projector_for(engine)).examined == 0  # no place in later sweeps
