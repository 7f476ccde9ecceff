"""Moving a session's expiry: ``extend_session`` adds to it, ``set_expiry`` sets it, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain import SessionExpired, SessionNotFound, ValidationError
from flowledger.domain.bounds import MAX_TTL
from flowledger.infrastructure import Engine


def test_extending_a_session_adds_the_ttl_to_its_current_expiry(engine: Engine) -> None:
    # Given a session that lives 24 hours
    started = engine.start_session("s1", "cs", ttl=timedelta(hours=24))
    # When it is extended by one hour
    extended = engine.extend_session("s1", timedelta(hours=1))
    # Then it lives 25 hours, not one
    assert extended.expires_at == started.expires_at + timedelta(hours=1)
    assert engine.get_session("s1").expires_at == started.expires_at + timedelta(hours=1)


def test_extensions_add_up(engine: Engine) -> None:
    started = engine.start_session("s1", "cs", ttl=timedelta(hours=1))
    engine.extend_session("s1", timedelta(minutes=30))
    engine.extend_session("s1", timedelta(minutes=30))
    assert engine.get_session("s1").expires_at == started.expires_at + timedelta(hours=1)


def test_setting_the_expiry_moves_it_to_that_moment_even_earlier(engine: Engine) -> None:
    engine.start_session("s1", "cs", ttl=timedelta(hours=24))
    moment = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    assert engine.set_expiry("s1", moment).expires_at == moment
    assert engine.get_session("s1").expires_at == moment
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started", "Session.Extended"]


@pytest.mark.parametrize(
    ("offset", "message"),
    [
        (timedelta(hours=-1), r"expires_at: must lie in the future"),
        (MAX_TTL + timedelta(days=1), r"expires_at: must lie at most 366 days ahead"),
    ],
)
def test_setting_the_expiry_in_the_past_or_beyond_the_ttl_bound_is_refused(
    engine: Engine, offset: timedelta, message: str
) -> None:
    started = engine.start_session("s1", "cs", ttl=timedelta(hours=24))
    with pytest.raises(ValidationError, match=message) as raised:
        engine.set_expiry("s1", datetime.now(UTC) + offset)
    assert raised.value.field == "expires_at"
    assert engine.get_session("s1").expires_at == started.expires_at
    assert len(engine.history("s1")) == 1


def test_setting_a_naive_expiry_is_refused(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    with pytest.raises(
        ValidationError,
        match=r"expires_at: must carry a time zone \(like \+00:00 or Z\), got 2030-01-01T00:00:00$",
    ):
        engine.set_expiry("s1", datetime(2030, 1, 1))


def test_setting_the_expiry_of_an_unknown_session_is_not_found(engine: Engine) -> None:
    with pytest.raises(SessionNotFound) as raised:
        engine.set_expiry("nope", datetime.now(UTC) + timedelta(hours=1))
    assert raised.value.session_id == "nope"


def test_an_expired_session_stays_expired_whichever_way_its_expiry_is_moved() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    engine = Engine.in_memory(clock=lambda: now[0])
    engine.start_session("s1", "cs", ttl=timedelta(minutes=30))
    now[0] += timedelta(hours=1)
    with pytest.raises(SessionExpired):
        engine.extend_session("s1", timedelta(hours=1))
    with pytest.raises(SessionExpired):
        engine.set_expiry("s1", now[0] + timedelta(hours=1))
    assert engine.get_session("s1").expires_at == datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
