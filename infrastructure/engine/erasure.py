"""Forgetting a user: crypto-shredding of the personal fields their sessions sealed.

``forget_user`` finds the user's sessions through the data-key table, records
``Session.DataErased`` on each (so the log itself says when and why, every later command
on them is refused, and projections replace their rows' personal values), and only then
destroys the keys and drops the sessions' snapshots. A crash in between leaves the keys
in place and the user findable: running ``forget`` again completes it (both steps are
idempotent). The events, their usage and their hashes are untouched.

A session recorded without sealing has no key: ``forget`` cannot erase it, and says so
(``ForgetReport.in_the_clear``; ``forget_session`` refuses it) rather than report "none".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar
from uuid import UUID

from eventsourcing.utils import get_topic

from flowledger.domain.bounds import MAX_REASON_LENGTH, require_text
from flowledger.domain.errors import AuditError, SessionNotFound, ValidationError
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.values import require_name
from flowledger.infrastructure.engine.log import EventLog
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.sealing import DataKeys, is_sealed

T = TypeVar("T")

_logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ForgetReport:
    """What one ``forget`` erased."""

    sessions: tuple[str, ...]
    """The ids of the sessions this run erased (their personal fields now read as erased)."""
    keys_destroyed: int
    already_erased: tuple[str, ...] = ()
    """The ids of the sessions asked for that an earlier run erased: nothing new recorded."""
    in_the_clear: tuple[str, ...] = ()
    """The ids of the user's sessions (``forget_user``), or of the session's forks
    (``forget_session``), recorded without sealing: they have no key to destroy, so their
    personal fields stay in the clear."""
    old_key_versions_remain: bool = False
    """Whether the destroyed keys' old row versions may still be in the key table's file (a
    transaction begun before the erasure outlived the purge's wait, or the rewrite failed): an
    operator's ``VACUUM FULL`` of the table removes them once that transaction has ended."""


_STARTS = (get_topic(Session.Started), get_topic(Session.Restarted))
"""The events that name a session's user."""
_FORKS = (get_topic(Session.Forked),)
"""The event that names a fork's parent."""
_PAGE = 5000
"""Start events read per query when looking for a user's unsealed sessions."""


class ErasureService:
    """Erases users' (or single sessions') personal data by destroying their data keys."""

    def __init__(
        self,
        store: AggregateStore,
        keys: DataKeys,
        tenant: str,
        log: EventLog,
        archived: Callable[[Sequence[UUID]], dict[UUID, str]] | None = None,
        sign: Callable[[], object] | None = None,
        archived_naming: Callable[[Sequence[bytes]], list[UUID]] | None = None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._log = log
        self._tenant = tenant
        self._archived = archived
        """Which of some streams retention archived, with their bundles (``docs/retention.md``)."""
        self._sign = sign
        """Takes a signed checkpoint (the chain's), so the erasure events are signed at once."""
        self._archived_naming = archived_naming
        """The archived streams whose stored snapshot holds one of some byte strings."""

    def forget_user(self, user_id: str, reason: str = "the user asked to be forgotten") -> ForgetReport:
        """Erase every sealed session of ``user_id`` in this tenant; the report names the
        user's sessions recorded without sealing, which stay in the clear (none: an empty report)."""
        require_name("user_id", user_id)
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)  # before anything is looked up
        streams = self._within_deadline(
            "find the user's sessions", lambda: self._keys.streams_of(self._tenant, user_id)
        )
        report = self._erase(streams, reason)
        return replace(report, in_the_clear=self._unsealed_sessions_of(user_id))

    def forget_session(self, session_id: str, reason: str = "the session was forgotten") -> ForgetReport:
        """Erase one session (for sessions started without a user id, too) and every session
        forked from it, or from those (each holds a copy of its context); forks recorded
        without sealing are named in ``in_the_clear``."""
        stream = session_uuid(self._tenant, session_id)
        # Before the session is looked up: "s-none" with reason 5 had answered "not found".
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        if self._store.load(stream) is None:
            raise SessionNotFound(session_id)
        if self._within_deadline("read a data key", lambda: self._keys.key_of(stream)) is None:
            raise ValidationError(
                "session_id", f"session {session_id!r} was recorded without sealing: no key to destroy"
            )
        # A fork's Forked event holds a copy of the context it was forked with, under the fork's
        # own key: forgetting the session alone left that copy readable in every fork of it.
        forks = self._forks_of(session_id)
        sealed = [
            fork
            for fork in forks
            if self._within_deadline("read a data key", partial(self._keys.key_of, fork))
        ]
        report = self._erase([stream, *sealed], reason)
        unsealed = [fork for fork in forks if fork not in sealed]
        return replace(report, in_the_clear=tuple(sorted(self._session_id(fork) for fork in unsealed)))

    def _forks_of(self, session_id: str) -> list[UUID]:
        """The streams of this tenant's sessions forked from ``session_id``, and of theirs, in
        the order found. One pass over the log's ``Forked`` events per generation: an event is
        decoded only when its bytes name a parent looked for (the parent's id is in the clear);
        and the archived forks, whose ``Forked`` event is in a bundle: their base's snapshot
        names the parent (``forked_from``, in the clear), so ``_erase`` refuses them as archived."""
        found: list[UUID] = []
        parents = {session_id}
        while parents:
            needles = {
                json.dumps(p, ensure_ascii=escaped).encode() for p in parents for escaped in (True, False)
            }
            candidates: list[UUID] = []
            after = 0
            while page := self._log.read(after, _PAGE, topics=_FORKS):
                after = page[-1].id
                candidates += [
                    UUID(str(stored.originator_id))
                    for stored in page
                    if any(n in stored.state for n in needles)
                ]
            if self._archived_naming is not None:
                named = [b'"forked_from":' + n for n in needles] + [b'"forked_from": ' + n for n in needles]
                candidates += self._within_deadline(
                    "read archived sessions", partial(self._archived_naming, named)
                )
            children: set[str] = set()
            for stream in candidates:
                if stream in found:
                    continue
                fork: Session | None = self._store.load(stream)
                if fork is not None and fork.tenant == self._tenant and fork.forked_from in parents:
                    found.append(stream)
                    children.add(fork.session_id)
            parents = children
        return found

    def _session_id(self, stream: UUID) -> str:
        session: Session | None = self._store.load(stream)
        return session.session_id if session is not None else str(stream)

    def _refuse_archived(self, streams: Sequence[UUID], done: str) -> None:
        """ValidationError naming the bundles when retention archived some of ``streams``: their
        bases keep the projections' rows (personal values in the clear) and their state is a
        snapshot sealed under the key. Restore them, then forget."""
        archived = self._archived(streams) if self._archived is not None and streams else {}
        if archived:
            bundles = sorted(set(archived.values()))
            raise ValidationError(
                "session",
                f"{len(archived)} of the sessions are archived (bundles: {', '.join(bundles)}):"
                f" `flowledger retention restore` them first, then forget; {done}",
            )

    def _erase(self, streams: Sequence[UUID], reason: str) -> ForgetReport:
        self._refuse_archived(streams, "nothing was erased")
        sessions: list[str] = []
        already: list[str] = []
        for stream in streams:
            marked = self._store.write(str(stream), partial(self._mark, stream, reason))
            if marked is not None:
                session_id, newly = marked
                (sessions if newly else already).append(session_id)
        # Again before any key goes: a retention run may have archived a session since the
        # check above (its base holds the rows of before the erasure). A run that reads a
        # session after its erasure event leaves it alone.
        self._refuse_archived(
            streams, "their erasure is recorded, no data key was destroyed: forget again after the restore"
        )
        # Destroying a destroyed key changes nothing: safe to try again.
        destroyed = (
            self._within_deadline("destroy data keys", lambda: self._keys.destroy(streams)) if streams else 0
        )
        # The destroyed keys' old row versions (their bytes, the user tags) are still in the
        # table's pages until they are purged (docs/erasure.md): done after the commit, outside
        # the operation deadline (it waits for readers older than the destruction).
        purge = getattr(self._keys, "purge", None)
        remains = bool(streams) and purge is not None and not purge()
        # The copies this engine cached applied the erasure to the window they held, which was
        # measured in the clear; the log now reads as markers, which measure smaller, so a fold
        # of it keeps more steps (session_window). Read afresh, the state is that fold.
        self._store.evict(streams)
        if self._sign is not None and streams:
            # Signed now: the erasure events are each stream's last, and an event appended after
            # the latest checkpoint can be deleted from a stream's end unseen (docs/audit.md).
            try:
                self._sign()
            except AuditError as error:
                # The erasure is done (the keys are destroyed): a checkpoint refused over a
                # tampered row elsewhere in the log is said, for `audit verify` to name, not
                # raised as if nothing had been erased. The next checkpoint signs the markers.
                _logger.warning(
                    "forget is done (%d keys destroyed), its checkpoint is not: %s", destroyed, error
                )
        return ForgetReport(
            sessions=tuple(sessions),
            keys_destroyed=destroyed,
            already_erased=tuple(already),
            old_key_versions_remain=remains,
        )

    def _unsealed_sessions_of(self, user_id: str) -> tuple[str, ...]:
        """The ids of this tenant's sessions of ``user_id`` that have no data key (recorded without
        sealing), sorted. One pass over the log's ``Started`` and ``Restarted`` events: a sealed
        one hides its user, an unsealed one is opened only when its bytes name the user."""
        # The user id's bytes as a JSON writer may put them: escaped, or as UTF-8.
        needles = {json.dumps(user_id, ensure_ascii=escaped)[1:-1].encode() for escaped in (True, False)}
        candidates: set[UUID] = set()
        after = 0
        while page := self._log.read(after, _PAGE, topics=_STARTS):
            after = page[-1].id
            for stored in page:
                if is_sealed(stored) or not any(n in stored.state for n in needles):
                    continue
                if self._log.decode(stored).user_id == user_id:
                    candidates.add(UUID(str(stored.originator_id)))
        if self._archived_naming is not None:
            # Archived: their Started event is in a bundle, their state in the base's snapshot
            # (one recorded in the clear holds the user id as written: `forget` had said none).
            candidates |= set(
                self._within_deadline("read archived sessions", partial(self._archived_naming, list(needles)))
            )
        found = []
        for stream in candidates:
            if self._within_deadline("read a data key", partial(self._keys.key_of, stream)) is not None:
                continue
            session: Session | None = self._store.load(stream)
            if session is not None and session.tenant == self._tenant and session.user_id == user_id:
                found.append(session.session_id)
        return tuple(sorted(found))

    def _within_deadline(self, operation: str, call: Callable[[], T]) -> T:
        return within_deadline(operation, self._store.settings.operation_deadline_s, call)

    @staticmethod
    def _mark(stream: UUID, reason: str, uow: UnitOfWork) -> tuple[str, bool] | None:
        """The session's id, and whether this call erased it (False: an earlier one had)."""
        session: Session | None = uow.find(stream)
        if session is None:
            return None  # a key whose start never committed: destroying it is all there is
        return session.session_id, session.erase(reason)
