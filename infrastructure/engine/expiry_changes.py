"""``Engine.change_expiry``: one command that moves a session's expiry by a duration or to a
moment, answered with the expiry before too."""

from __future__ import annotations

from datetime import datetime, timedelta

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.engine.sessions import ExpiryChange, SessionService


class ExpiryChanges:
    """Chooses ``SessionService.extend`` (``by``) or ``set_expiry`` (``to``); never both."""

    def __init__(self, sessions: SessionService) -> None:
        self._sessions = sessions

    def change(
        self,
        session_id: str,
        by: timedelta | None,
        to: datetime | None,
        reopen_expired: bool,
        idempotency_key: str | None,
    ) -> ExpiryChange:
        """The expiry moved ``by`` a duration or ``to`` a moment (ValidationError: neither or both)."""
        key = idempotency_key
        if by is not None and to is None:
            try:
                return self._sessions.extend(
                    session_id, by, reopen_expired=reopen_expired, idempotency_key=key
                )
            except ValidationError as refused:
                raise (refused.named("by") if refused.field == "ttl" else refused) from None
        if to is not None and by is None:
            return self._sessions.set_expiry(
                session_id, to, reopen_expired=reopen_expired, idempotency_key=key
            )
        raise ValidationError(
            "expires_at", "give a duration to add or a moment to set (one of them, not both)"
        )
