"""flowledger's error tree: every error a caller can catch derives from FlowledgerError.

    FlowledgerError
    ├── ValidationError            bad input; nothing was appended
    ├── SessionError               carries ``session_id``
    │   ├── SessionNotFound
    │   ├── SessionConflict        started again with another workflow or user
    │   ├── SessionExpired         carries ``expired_at``
    │   └── SessionClosed          carries ``status``
    └── ConcurrentUpdate           optimistic-concurrency retries ran out
"""

from __future__ import annotations

from datetime import datetime


class FlowledgerError(Exception):
    """Root of every error flowledger raises on purpose."""


class ValidationError(FlowledgerError, ValueError):
    """A command's input is invalid; nothing was appended."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class SessionError(FlowledgerError):
    """An error about one workflow session."""

    def __init__(self, session_id: str, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionNotFound(SessionError):
    """No session has this id (in this tenant)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id, f"session {session_id!r} not found")


class SessionConflict(SessionError):
    """The session exists with a different workflow or user."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(session_id, f"session {session_id!r} already exists: {detail}")


class SessionExpired(SessionError):
    """The session's TTL ran out before this command."""

    def __init__(self, session_id: str, expired_at: datetime) -> None:
        super().__init__(
            session_id, f"session {session_id!r} expired at {expired_at.isoformat()}"
        )
        self.expired_at = expired_at


class SessionClosed(SessionError):
    """The session is completed or abandoned and takes no more steps."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(session_id, f"session {session_id!r} is {status}")
        self.status = status


class ConcurrentUpdate(FlowledgerError):
    """Other writers kept changing the aggregate; retries ran out."""

    def __init__(self, aggregate_id: str, attempts: int) -> None:
        super().__init__(
            f"{aggregate_id!r} was changed concurrently {attempts} times; giving up"
        )
        self.aggregate_id = aggregate_id
        self.attempts = attempts
