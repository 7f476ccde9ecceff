"""Extending a session is bounded like setting its expiry: at most ``MAX_TTL`` after now.

Each extension alone is at most ``MAX_TTL``; these tests check that repeated ones cannot push
the expiry further than ``set_expiry`` may, in the engine, over HTTP and through the webhook.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain import SessionClosed, ValidationError
from flowledger.domain.bounds import MAX_TTL
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BEYOND = r"ttl: the expiry would be .+, and must lie at most 366 days ahead \(until .+\)"


@pytest.fixture
def still() -> Iterator[Engine]:
    """An in-memory engine whose clock stands at ``NOW``, so the bound is an exact moment."""
    with Engine(settings=make_settings(database_url="memory:"), clock=lambda: NOW) as engine:
        yield engine


def test_extending_up_to_exactly_the_bound_is_allowed(still: Engine) -> None:
    """An expiry of exactly now + MAX_TTL, reached in two extensions, is within the bound."""
    # Given a session that lives one hour
    still.start_session("s1", "cs", ttl=timedelta(hours=1))
    # When it is extended twice, to exactly MAX_TTL from now
    still.extend_session("s1", MAX_TTL - timedelta(hours=3))
    extended = still.extend_session("s1", timedelta(hours=2))
    # Then both extensions are kept
    assert extended.expires_at == NOW + MAX_TTL
    assert still.get_session("s1").version == 3


def test_an_extension_past_the_bound_is_refused_and_records_nothing(still: Engine) -> None:
    """One second past now + MAX_TTL is a ValidationError on ``ttl``; the session is unchanged."""
    # Given a session already at the bound
    still.start_session("s1", "cs", ttl=timedelta(hours=1))
    at_bound = still.extend_session("s1", MAX_TTL - timedelta(hours=1))
    # When it is extended by one second more
    with pytest.raises(ValidationError, match=BEYOND) as raised:
        still.extend_session("s1", timedelta(seconds=1))
    # Then the error names the field and the moment, and no event was appended
    assert raised.value.field == "ttl"
    assert raised.value.message == (
        "the expiry would be 2027-03-02T12:00:01+00:00, and must lie at most 366 days ahead"
        " (until 2027-03-02T12:00:00+00:00): nothing can be added"
    )
    assert still.get_session("s1").version == at_bound.version
    assert still.get_session("s1").expires_at == NOW + MAX_TTL


def test_the_refusal_says_how_much_can_still_be_added(still: Engine) -> None:
    """A first extension by the whole MAX_TTL overshoots by the session's own hour."""
    # Given a session that lives one hour
    started = still.start_session("s1", "cs", ttl=timedelta(hours=1))
    # When it is extended by MAX_TTL
    with pytest.raises(ValidationError, match=BEYOND.replace("ttl:", "by:", 1)) as raised:
        still.change_expiry("s1", by=MAX_TTL)  # its argument's name (extend_session's is ttl)
    # Then the message says what is left, and the session is as it was
    assert raised.value.message.endswith(": at most 365 days, 23:00:00 can still be added")
    assert still.get_session("s1") == started


def test_repeated_extensions_cannot_push_the_expiry_years_ahead(engine: Engine) -> None:
    """The reported defect, on both backends: the second of two large extensions is refused."""
    # Given a session that lives one hour, extended to within two hours of the bound
    engine.start_session("s1", "cs", ttl=timedelta(hours=1))
    near = engine.extend_session("s1", MAX_TTL - timedelta(hours=2))
    # When it is extended by two hours more (past the bound unless an hour went by)
    with pytest.raises(ValidationError, match=BEYOND) as raised:
        engine.extend_session("s1", timedelta(hours=2))
    # Then it is refused on ``ttl`` and nothing was appended
    assert raised.value.field == "ttl"
    assert engine.get_session("s1").version == near.version
    assert engine.get_session("s1").expires_at == near.expires_at
    assert len(engine.history("s1")) == 2


def test_reopening_an_expired_session_for_the_whole_ttl_is_within_the_bound() -> None:
    """``reopen_expired`` gives now + ttl, which MAX_TTL never exceeds."""
    # Given a session whose hour ran out
    now = [NOW]
    with Engine(settings=make_settings(database_url="memory:"), clock=lambda: now[0]) as engine:
        engine.start_session("s1", "cs", ttl=timedelta(hours=1))
        now[0] += timedelta(hours=2)
        # When it is reopened for MAX_TTL
        change = engine.change_expiry("s1", by=MAX_TTL, reopen_expired=True)
        # Then it lives MAX_TTL from now
        assert change.reopened
        assert change.state.expires_at == now[0] + MAX_TTL


def test_a_closed_session_is_refused_as_closed_before_the_bound_is_named(still: Engine) -> None:
    """Whether the session takes commands at all comes first, as for an extension within bound."""
    # Given a completed session
    still.start_session("s1", "cs", ttl=timedelta(hours=1))
    still.complete_session("s1", "done")
    # When it is extended past the bound
    # Then it is refused as closed, and nothing was appended
    with pytest.raises(SessionClosed):
        still.extend_session("s1", MAX_TTL)
    assert still.get_session("s1").version == 2


def test_http_and_webhook_answer_422_with_the_field_and_the_message(still: Engine) -> None:
    """``POST /extend`` with ``ttl_seconds`` and the webhook's ``expires_hours`` map the refusal to 422."""
    with TestClient(create_app(still, require_keys=False)) as http:
        # Given a session extended over HTTP to exactly the bound
        created = http.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs", "ttl_seconds": 3600})
        assert created.status_code == 201
        first = http.post("/v1/sessions/s1/extend", json={"ttl_seconds": MAX_TTL.total_seconds() - 3600})
        assert first.status_code == 200, first.json()
        # When it is extended again, by REST and by the webhook
        again = http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 3600})
        hook = http.post(
            "/webhook/workflow-state",
            json={"action": "extend_session", "session_id": "s1", "expires_hours": 1},
        )
    # Then both answer 422 naming the field and the bound, and only the first extension is kept
    for refused, field in ((again, "ttl_seconds"), (hook, "expires_hours")):  # each as its body names it
        assert refused.status_code == 422
        assert refused.json()["success"] is False
        assert refused.json()["error"].startswith(f"{field}: the expiry would be 2027-03-02T13:00:00+00:00")
        assert "must lie at most 366 days ahead" in refused.json()["error"]
    assert [e.event_type for e in still.history("s1")] == ["Session.Started", "Session.Extended"]


@pytest.mark.parametrize("ttl", [timedelta(days=400), MAX_TTL + timedelta(seconds=1), timedelta.max])
def test_an_extension_longer_than_the_bound_itself_says_how_much_can_still_be_added(
    still: Engine, ttl: timedelta
) -> None:
    # Given a session that lives one hour
    started = still.start_session("s1", "cs", ttl=timedelta(hours=1))
    # When it is extended by more than MAX_TTL at once
    with pytest.raises(ValidationError) as raised:
        still.extend_session("s1", ttl)
    # Then the refusal says what is left, as one within MAX_TTL does, and nothing was recorded
    assert raised.value.field == "ttl"
    assert "must lie at most 366 days ahead (until 2027-03-02T12:00:00+00:00)" in raised.value.message
    assert raised.value.message.endswith(": at most 365 days, 23:00:00 can still be added")
    assert still.get_session("s1") == started


def test_reopening_for_longer_than_the_bound_says_the_whole_bound_can_be_added() -> None:
    now = [NOW]
    with Engine(settings=make_settings(database_url="memory:"), clock=lambda: now[0]) as engine:
        engine.start_session("s1", "cs", ttl=timedelta(hours=1))
        now[0] += timedelta(hours=2)
        with pytest.raises(ValidationError) as raised:
            engine.change_expiry("s1", by=timedelta(days=400), reopen_expired=True)
        assert raised.value.field == "by"  # change_expiry's argument (extend_session's is ttl)
        assert raised.value.message.endswith(": at most 366 days, 0:00:00 can still be added")


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(hours=-1)])
def test_an_extension_that_is_not_positive_is_refused_as_such(still: Engine, ttl: timedelta) -> None:
    still.start_session("s1", "cs", ttl=timedelta(hours=1))
    with pytest.raises(ValidationError, match="ttl: must be a positive duration"):
        still.extend_session("s1", ttl)
