"""A session's extension sent again under its idempotency key moves the expiry once.

An outside probe: a client that timed out on ``POST /v1/sessions/{id}/extend`` (the first
request had committed) and retried with the same ``Idempotency-Key`` doubled the extension: a
24 h session extended by 1 h lived 26 h. The extend commands took no key at all (REST, the
webhook's ``extend_session``, ``Engine.extend_session``), so nothing could tell a retry from
a second extension. A key now names one move of the expiry, recorded as the command id of its
event: a repeat is answered as the first request was, with nothing appended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.aggregate import command_id_of
from flowledger.domain.errors import IdempotencyKeyReused
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.conftest import make_settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def still() -> Iterator[Engine]:
    """An in-memory engine whose clock stands at ``NOW``."""
    with Engine(settings=make_settings(database_url="memory:"), clock=lambda: NOW) as engine:
        yield engine


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type for e in engine.history(session_id)]


def test_a_rest_extension_retried_with_its_idempotency_key_moves_the_expiry_once(still: Engine) -> None:
    with TestClient(create_app(still, require_keys=False)) as http:
        # Given a session that lives 24 h
        http.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs", "ttl_seconds": 86_400})
        # When the client extends it by 1 h, and sends the request again under its key
        # (its first answer timed out), once with the key in the body too
        headers = {"Idempotency-Key": "ext-1"}
        first = http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 3600}, headers=headers)
        again = http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 3600}, headers=headers)
        in_body = http.post("/v1/sessions/s1/extend", json={"ttl_seconds": 3600, "idempotency_key": "ext-1"})
    # Then the session lives 25 h, not 26 h or 27 h, and each answer says so
    for answer in (first, again, in_body):
        assert answer.status_code == 200, answer.json()
        assert answer.json()["expires_at"] == "2026-03-02T13:00:00Z"
    assert still.get_session("s1").expires_at == NOW + timedelta(hours=25)
    assert event_types(still, "s1") == ["Session.Started", "Session.Extended"]


def test_a_webhook_extension_retried_with_its_key_is_answered_as_the_first_was(still: Engine) -> None:
    with TestClient(create_app(still, require_keys=False)) as http:
        http.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs", "ttl_seconds": 86_400})
        request = {
            "action": "extend_session",
            "session_id": "s1",
            "expires_hours": 1,
            "idempotency_key": "e1",
        }
        first = http.post("/webhook/workflow-state", json=request)
        again = http.post("/webhook/workflow-state", json=request)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert first.json()["data"]["previous_expires_at"] == "2026-03-02T12:00:00+00:00"
    assert still.get_session("s1").expires_at == NOW + timedelta(hours=25)


def test_without_a_key_two_extensions_are_two(still: Engine) -> None:
    still.start_session("s1", "cs", ttl=timedelta(hours=24))
    still.extend_session("s1", timedelta(hours=1))
    assert still.extend_session("s1", timedelta(hours=1)).expires_at == NOW + timedelta(hours=26)


def test_a_key_reused_for_another_extension_is_refused_and_appends_nothing(still: Engine) -> None:
    still.start_session("s1", "cs", ttl=timedelta(hours=24))
    still.extend_session("s1", timedelta(hours=1), idempotency_key="e1")
    with pytest.raises(IdempotencyKeyReused, match="ttl"):
        still.extend_session("s1", timedelta(hours=2), idempotency_key="e1")
    with pytest.raises(IdempotencyKeyReused, match="expires_at"):
        still.set_expiry("s1", NOW + timedelta(hours=30), idempotency_key="e1")
    assert event_types(still, "s1") == ["Session.Started", "Session.Extended"]
    # the moment the key set is its own repeat
    still.set_expiry("s1", NOW + timedelta(hours=30), idempotency_key="e2")
    assert still.set_expiry("s1", NOW + timedelta(hours=30), idempotency_key="e2").version == 3


def lose_first_reply(engine: Engine) -> list[str]:
    """The store's first save commits, and then its caller hears the connection break."""
    save: Callable[..., None] = engine.store._save
    happened: list[str] = []

    def faulty(uow: UnitOfWork, events: list[Any]) -> None:
        save(uow, events)
        if not happened:
            happened.append("lost-reply")
            raise OperationalError("server closed the connection unexpectedly")

    engine.store._save = faulty  # type: ignore[method-assign]
    return happened


def test_an_extension_whose_commit_reply_was_lost_is_stored_once_and_a_retry_too(engine: Engine) -> None:
    # Given a session, and a save whose commit happens but whose reply is lost
    started = engine.start_session("s1", "cs", ttl=timedelta(hours=24))
    happened = lose_first_reply(engine)
    # When it is extended under a key, and the client sends the extension again
    extended = engine.extend_session("s1", timedelta(hours=1), idempotency_key="ext-1")
    again = engine.extend_session("s1", timedelta(hours=1), idempotency_key="ext-1")
    # Then the expiry moved once, by the one event the key names
    assert happened == ["lost-reply"]
    assert extended.expires_at == again.expires_at == started.expires_at + timedelta(hours=1)
    events = engine.log.stream(engine.session_uuid("s1"))
    assert [command_id_of(e) for e in events][1:] == ["ext-1"]


def test_a_keyed_move_of_the_expiry_under_a_new_key_searches_no_stream(
    still: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session with steps and moves of its expiry, and a count of the stream's searches
    # (an outside probe: 64 engines extending one session under keys met ConcurrentUpdate 5
    # times in 384 calls, none without keys: two searches an attempt widened its race)
    still.start_session("s9", "cs")
    still.record_step("s9", "a", input={}, output={}, idempotency_key="step-1")
    still.extend_session("s9", timedelta(hours=1), idempotency_key="ext-1")
    searches: list[str] = []
    search = still.store.events_containing

    def counted(*args: Any) -> list[Any]:
        searches.append(str(args[1]))
        return search(*args)

    monkeypatch.setattr(still.store, "events_containing", counted)
    # When the expiry is moved under new keys, the key filter ruling them out
    still.extend_session("s9", timedelta(hours=1), idempotency_key="ext-2")
    still.set_expiry("s9", NOW + timedelta(hours=30), idempotency_key="to-1")
    # Then the stream is not searched
    assert searches == []
    # And a repeat is still found in the stream and answered as the first call was
    again = still.change_expiry("s9", by=timedelta(hours=1), idempotency_key="ext-2")
    assert searches, "a key the filter holds is looked up in the stream"
    assert again.previous_expires_at == NOW + timedelta(hours=25)
    assert [e for e in event_types(still, "s9") if e == "Session.Extended"] == ["Session.Extended"] * 3
