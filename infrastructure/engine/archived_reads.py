"""Reads and forks of sessions that retention may have archived (``Engine.get_session``,
``history``, ``session_steps``, ``fork_or_get_session``): a read that needs archived events
is answered SessionArchived, naming the bundle, rather than SessionNotFound or a false alarm."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from flowledger.domain.errors import SessionArchived, SessionNotFound, StoredEventMissing
from flowledger.domain.session_views import SessionState, StepRecord
from flowledger.infrastructure.engine.archive_access import ArchiveAccess
from flowledger.infrastructure.engine.sessions import SessionService, Start
from flowledger.infrastructure.history import HistoryEntry


class ArchivedReads:
    """A tenant's session reads, with what retention archived told apart from what never was."""

    def __init__(self, sessions: SessionService, archives: ArchiveAccess) -> None:
        self._sessions = sessions
        self._archives = archives

    def get(self, session_id: str, version: int | None, as_of: datetime | None) -> SessionState:
        """``Engine.get_session``: an archived session reads now, at its last version and as of
        a moment at or after its last event; earlier needs its events (SessionArchived)."""
        if version is None and as_of is None:
            return self._sessions.get(session_id, version, as_of)
        try:
            with self._archived_as_such(session_id):
                return self._sessions.get(session_id, version, as_of)
        except SessionArchived:
            if as_of is None:
                raise
            head = self._sessions.get(session_id)
            if head.updated_at <= as_of:  # the whole stream is the prefix
                return head
            raise

    def history(self, session_id: str) -> list[HistoryEntry]:
        """``Engine.history``."""
        with self._archived_as_such(session_id):
            return self._sessions.history(session_id)

    def steps(self, session_id: str) -> list[StepRecord]:
        """``Engine.session_steps``."""
        with self._archived_as_such(session_id):
            return self._sessions.steps(session_id)

    def fork(self, session_id: str, at_version: int, new_session_id: str, ttl: timedelta) -> Start:
        """``Engine.fork_or_get_session``: an archived parent forks at its last version only."""
        with self._archived_as_such(session_id):
            return self._sessions.fork(session_id, at_version, new_session_id, ttl)

    @contextmanager
    def _archived_as_such(self, session_id: str) -> Iterator[None]:
        """Turn a SessionNotFound of an archived session into SessionArchived, naming its bundle."""
        archives = self._archives
        try:
            yield
        except SessionNotFound:
            bundle = archives.retention().archived_in(session_id) if archives.keeps_archives else None
            if bundle is not None:
                raise SessionArchived(session_id, bundle) from None
            raise
        except StoredEventMissing as missing:
            # An archived session written again (an expired one restarted) has rows after its
            # base and none before: a read of its events found "version 1 missing (the next
            # stored is N+1)", a false alarm of tampering (exit 65). That gap is the archive's.
            archived = archives.retention().archived_through(session_id) if archives.keeps_archives else None
            if archived is not None and (missing.version, missing.found) == (1, archived[1] + 1):
                raise SessionArchived(session_id, archived[0]) from None
            raise
