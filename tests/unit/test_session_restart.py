"""Restarting a session (the seed's repeated ``create_session``) and reopening an expired one."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain import SessionClosed, SessionConflict
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["memory", "postgres"])
def timed(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, list[datetime]]]:
    """An engine whose clock the test moves, on both backends."""
    now = [START]
    if request.param == "memory":
        settings = make_settings(database_url="memory:")
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"), schema=request.getfixturevalue("pg_schema")
        )
    with Engine(settings=settings, clock=lambda: now[0]) as engine:
        yield engine, now


def test_restarting_a_live_session_goes_back_to_init_and_keeps_history_context_and_expiry(
    timed: tuple[Engine, list[datetime]],
) -> None:
    engine, _ = timed
    first = engine.restart_session("s1", "cs", ttl=timedelta(hours=2))
    assert (first.created, first.reopened) == (True, False)
    engine.record_step("s1", "classify", next_step="answer", context_update={"intent": "refund"})
    again = engine.restart_session("s1", "cs", user_id="u1", ttl=timedelta(hours=50))
    assert (again.created, again.reopened) == (False, False)
    state = engine.get_session("s1")
    assert (state.current_step, state.context, state.user_id) == ("init", {"intent": "refund"}, "u1")
    assert state.expires_at == first.state.expires_at
    assert [r.step for r in state.history] == ["classify"]
    assert [e.event_type for e in engine.history("s1")][-1] == "Session.Restarted"
    # Replay before the restart still shows where the session stood.
    assert engine.get_session("s1", version=2).current_step == "answer"


def test_restarting_an_expired_session_records_the_expiry_then_gives_it_the_ttl_from_now(
    timed: tuple[Engine, list[datetime]],
) -> None:
    engine, now = timed
    engine.restart_session("s1", "cs", ttl=timedelta(hours=1))
    now[0] += timedelta(hours=3)
    restarted = engine.restart_session("s1", "cs", ttl=timedelta(hours=4))
    assert restarted.reopened is True
    assert restarted.state.expires_at == now[0] + timedelta(hours=4)
    assert restarted.state.status.value == "active"
    kinds = [e.event_type for e in engine.history("s1")]
    assert kinds == ["Session.Started", "Session.Expired", "Session.Restarted"]


def test_a_restart_with_another_workflow_or_user_or_of_a_closed_session_appends_nothing(
    timed: tuple[Engine, list[datetime]],
) -> None:
    engine, _ = timed
    engine.restart_session("s1", "cs", user_id="u1")
    engine.restart_session("s2", "cs")
    engine.complete_session("s2", "done")
    head = engine.log.head()
    with pytest.raises(SessionConflict):
        engine.restart_session("s1", "cs", user_id="u2")
    with pytest.raises(SessionConflict):
        engine.restart_session("s1", "other", user_id="u1")
    with pytest.raises(SessionClosed):
        engine.restart_session("s2", "cs")
    assert engine.log.head() == head


def test_reopening_extends_an_expired_session_from_now_and_a_live_one_from_its_expiry(
    timed: tuple[Engine, list[datetime]],
) -> None:
    engine, now = timed
    engine.start_session("s1", "cs", ttl=timedelta(hours=1))
    live = engine.change_expiry("s1", by=timedelta(hours=1), reopen_expired=True)
    assert (live.reopened, live.previous_expires_at) == (False, START + timedelta(hours=1))
    assert live.state.expires_at == START + timedelta(hours=2)
    now[0] += timedelta(hours=5)
    reopened = engine.change_expiry("s1", by=timedelta(hours=1), reopen_expired=True)
    assert reopened.reopened is True
    assert reopened.state.expires_at == now[0] + timedelta(hours=1)
    engine.record_step("s1", "late")
    kinds = [e.event_type.removeprefix("Session.") for e in engine.history("s1")]
    assert kinds == ["Started", "Extended", "Expired", "Reopened", "StepProcessed"]


def test_restarting_a_session_already_at_init_appends_nothing(
    timed: tuple[Engine, list[datetime]],
) -> None:
    # Given a session at init: just started, or just restarted after a step
    engine, _ = timed
    engine.start_session("s1", "cs", user_id="u1")
    engine.restart_session("s2", "cs")
    engine.record_step("s2", "classify", next_step="answer")
    engine.restart_session("s2", "cs")
    head = engine.log.head()
    # When it is restarted again (the seed's create_session sent on every run, or a retry whose
    # answer was lost)
    again = [engine.restart_session("s1", "cs", user_id="u1") for _ in range(3)]
    again += [engine.restart_session("s1", "cs"), engine.restart_session("s2", "cs")]
    # Then nothing changes, so nothing is appended, and each is answered with the state as it stands
    assert engine.log.head() == head
    assert all((r.created, r.reopened, r.state.current_step) == (False, False, "init") for r in again)
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started"]
    assert [e.event_type.removeprefix("Session.") for e in engine.history("s2")] == [
        "Started",
        "StepProcessed",
        "Restarted",
    ]


def test_a_restart_that_names_a_user_for_a_session_without_one_is_still_recorded(
    timed: tuple[Engine, list[datetime]],
) -> None:
    engine, _ = timed
    engine.start_session("s1", "cs")
    restarted = engine.restart_session("s1", "cs", user_id="u1")
    assert restarted.state.user_id == "u1"
    assert [e.event_type for e in engine.history("s1")][-1] == "Session.Restarted"
    assert engine.get_session("s1").user_id == "u1"
