"""An empty context update is a no-op, as a repeated start is: nothing appended, the state returned."""

from __future__ import annotations

import pytest

from flowledger.domain.errors import IdempotencyKeyReused, SessionClosed, ValidationError
from flowledger.infrastructure import Engine


def test_an_empty_context_update_appends_nothing_and_returns_the_state(engine: Engine) -> None:
    # Given a session with some context
    engine.start_session("s", "wf")
    before = engine.update_context("s", {"a": 1})
    # When nothing is merged into it
    after = engine.update_context("s", {})
    # Then nothing is recorded and the state is the one it had
    assert after == before
    assert [entry.event_type for entry in engine.history("s")].count("Session.ContextUpdated") == 1
    assert engine.get_session("s").version == before.version


def test_an_empty_context_update_of_a_closed_session_is_still_refused(engine: Engine) -> None:
    engine.start_session("s", "wf")
    engine.abandon_session("s")
    with pytest.raises(SessionClosed):
        engine.update_context("s", {})


def test_a_context_update_that_is_not_an_object_is_still_refused(engine: Engine) -> None:
    engine.start_session("s", "wf")
    with pytest.raises(ValidationError) as raised:
        engine.update_context("s", [])  # type: ignore[arg-type]
    assert raised.value.field == "context_update"


def test_an_empty_context_update_under_a_key_holds_the_key_as_any_update_does(engine: Engine) -> None:
    """A keyed empty update recorded nothing, so its key stayed free: another update sent
    under it was applied, where the key with another update is refused for any other update."""
    # Given an empty update sent under a key
    engine.start_session("s", "wf")
    first = engine.update_context("s", {}, idempotency_key="k1")
    # When it is sent again, Then it is the same request: answered, nothing more recorded
    assert engine.update_context("s", {}, idempotency_key="k1") == first
    # And another update under the key is refused, changing nothing
    with pytest.raises(IdempotencyKeyReused):
        engine.update_context("s", {"a": 1}, idempotency_key="k1")
    assert engine.get_session("s").context == {}
    assert engine.get_session("s").version == first.version
