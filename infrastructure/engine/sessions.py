"""The Engine's session commands beyond starting and recording: context, TTL, endings."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from flowledger.domain.errors import ValidationError
from flowledger.domain.session import Session
from flowledger.domain.session_views import SessionState
from flowledger.domain.values import JsonObject, require_ttl

T = TypeVar("T")


class SessionCommands:
    """Mixed into Engine, which provides ``update`` and ``clock``."""

    clock: Callable[[], datetime]

    def update(self, session_id: str, command: Callable[[Session], T]) -> T:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    def update_context(self, session_id: str, update: JsonObject) -> SessionState:
        """Merge keys into the session context."""

        def merge(session: Session) -> SessionState:
            session.ensure_open(self.clock())
            session.update_context(update)
            return session.state()

        return self.update(session_id, merge)

    def extend_session(self, session_id: str, ttl: timedelta) -> SessionState:
        """Push the expiry to now + ttl (a session that already expired stays expired)."""
        require_ttl(ttl)

        def extend(session: Session) -> SessionState:
            now = self.clock()
            session.ensure_open(now)
            session.extend(now + ttl)
            return session.state()

        return self.update(session_id, extend)

    def complete_session(self, session_id: str, resolution: JsonObject | str) -> SessionState:
        """End the session with a resolution: a JSON object, or a string kept as ``{"resolution": s}``."""
        payload = {"resolution": resolution} if isinstance(resolution, str) else resolution
        if not isinstance(payload, dict):
            raise ValidationError("resolution", "must be a string or a JSON object")

        def complete(session: Session) -> SessionState:
            session.ensure_open(self.clock())
            session.complete(payload)
            return session.state()

        return self.update(session_id, complete)

    def abandon_session(self, session_id: str, reason: str = "abandoned") -> SessionState:
        """Give the session up."""

        def abandon(session: Session) -> SessionState:
            session.ensure_open(self.clock())
            session.abandon(reason)
            return session.state()

        return self.update(session_id, abandon)
