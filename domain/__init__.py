"""flowledger domain: aggregates, events, value objects and errors. Pure: no I/O."""

from flowledger.domain.errors import (
    ConcurrentUpdate,
    FlowledgerError,
    SessionClosed,
    SessionConflict,
    SessionError,
    SessionExpired,
    SessionNotFound,
    ValidationError,
)
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.session_views import SessionState, SessionStatus, StepFailure, StepRecord
from flowledger.domain.values import LlmUsage

__all__ = [
    "ConcurrentUpdate",
    "FlowledgerError",
    "LlmUsage",
    "Session",
    "SessionClosed",
    "SessionConflict",
    "SessionError",
    "SessionExpired",
    "SessionNotFound",
    "SessionState",
    "SessionStatus",
    "StepFailure",
    "StepRecord",
    "ValidationError",
    "session_uuid",
]
