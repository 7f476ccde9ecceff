"""Forgetting a user: crypto-shredding of the personal fields their sessions sealed.

``forget_user`` finds the user's sessions through the data-key table, records
``Session.DataErased`` on each (so the log itself says when and why, every later command
on them is refused, and projections replace their rows' personal values), and only then
destroys the keys and drops the sessions' snapshots. A crash in between leaves the keys
in place and the user findable: running ``forget`` again completes it (both steps are
idempotent). The events, their usage and their hashes are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar
from uuid import UUID

from flowledger.domain.errors import SessionNotFound, ValidationError
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.values import require_name
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.sealing import DataKeys

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ForgetReport:
    """What one ``forget`` erased."""

    sessions: tuple[str, ...]
    """The ids of the sessions whose personal fields now read as erased."""
    keys_destroyed: int


class ErasureService:
    """Erases users' (or single sessions') personal data by destroying their data keys."""

    def __init__(
        self,
        store: AggregateStore,
        keys: DataKeys,
        tenant: str,
        archived: Callable[[Sequence[UUID]], dict[UUID, str]] | None = None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._tenant = tenant
        self._archived = archived
        """Which of some streams retention archived, with their bundles (``docs/retention.md``)."""

    def forget_user(self, user_id: str, reason: str = "the user asked to be forgotten") -> ForgetReport:
        """Erase every session of ``user_id`` in this tenant (none found: an empty report)."""
        require_name("user_id", user_id)
        streams = self._within_deadline(
            "find the user's sessions", lambda: self._keys.streams_of(self._tenant, user_id)
        )
        return self._erase(streams, reason)

    def forget_session(self, session_id: str, reason: str = "the session was forgotten") -> ForgetReport:
        """Erase one session (for sessions started without a user id, too)."""
        stream = session_uuid(self._tenant, session_id)
        if self._store.load(stream) is None:
            raise SessionNotFound(session_id)
        if self._within_deadline("read a data key", lambda: self._keys.key_of(stream)) is None:
            raise ValidationError(
                "session_id", f"session {session_id!r} was recorded without sealing: no key to destroy"
            )
        return self._erase([stream], reason)

    def _erase(self, streams: Sequence[UUID], reason: str) -> ForgetReport:
        archived = self._archived(streams) if self._archived is not None and streams else {}
        if archived:
            # Their bases keep the projections' rows (personal values in the clear) and their
            # state is a snapshot sealed under the key: restore them, then forget.
            bundles = sorted(set(archived.values()))
            raise ValidationError(
                "session",
                f"{len(archived)} of the sessions are archived (bundles: {', '.join(bundles)}):"
                " `flowledger retention restore` them first, then forget; nothing was erased",
            )
        sessions = []
        for stream in streams:
            erased = self._store.write(str(stream), partial(self._mark, stream, reason))
            if erased is not None:
                sessions.append(erased)
        # Destroying a destroyed key changes nothing: safe to try again.
        destroyed = (
            self._within_deadline("destroy data keys", lambda: self._keys.destroy(streams)) if streams else 0
        )
        return ForgetReport(sessions=tuple(sessions), keys_destroyed=destroyed)

    def _within_deadline(self, operation: str, call: Callable[[], T]) -> T:
        return within_deadline(operation, self._store.settings.operation_deadline_s, call)

    @staticmethod
    def _mark(stream: UUID, reason: str, uow: UnitOfWork) -> str | None:
        session: Session | None = uow.find(stream)
        if session is None:
            return None  # a key whose start never committed: destroying it is all there is
        session.erase(reason)
        return session.session_id
