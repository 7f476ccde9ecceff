"""Session use cases: start, record steps, context, TTL, endings, and reading a session back.

Each command is a named method that the store runs as one unit of work: it finds the
session, calls one Session method and returns a plain value. The store does the rest
(lock, cache, save, snapshot, retries, recovery of unknown commits).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

from flowledger.domain.aggregate import command_id_of, made_by_engine
from flowledger.domain.bounds import (
    MAX_TTL,
    require_duration,
    require_flag,
    require_moment,
    require_object,
    shown,
    versions_held,
)
from flowledger.domain.errors import (
    FlowledgerError,
    IdempotencyKeyReused,
    SessionArchived,
    SessionClosed,
    SessionConflict,
    SessionNotFound,
    SessionNotYetStarted,
    ValidationError,
)
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.session_rules import require_owner
from flowledger.domain.session_views import (
    MAYBE_SEEN,
    NOT_SEEN,
    ModelAsked,
    PendingStep,
    SessionState,
    SessionStatus,
    StepRecord,
)
from flowledger.domain.values import (
    JsonObject,
    LlmUsage,
    require_given_usage,
    require_id,
    require_name,
    require_resolution,
    require_ttl,
    require_version,
)
from flowledger.infrastructure.engine.key_kinds import (
    EXPIRY_CHANGE,
    context_updated_under,
    expiry_moves_under,
    refuse_other_kinds_for_step,
    refuse_step_key_for_expiry,
    refuse_update_key_for_expiry,
)
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.history import HistoryEntry, history_entry

T = TypeVar("T")
FORKED_AT = 2
"""The version of a fork's ``Forked`` event, appended with its ``Started`` (``_fork``)."""


@dataclass(frozen=True, kw_only=True)
class StepRequest:
    """A step whose model call happened elsewhere, as ``record_step`` takes it."""

    step: str
    input: JsonObject
    output: JsonObject
    next_step: str | None = None
    context_update: JsonObject | None = None
    usage: LlmUsage | None = None
    idempotency_key: str | None = None
    user_id: str | None = None
    """The user the request claims: the step is refused (SessionOwnedByAnother) when the session
    has another, checked on the session the step loads, before anything else."""


@dataclass(frozen=True, kw_only=True)
class Start:
    """What ``SessionService.start_or_get`` did: ``created`` the session, or found the one
    started with the same workflow and user (nothing appended)."""

    state: SessionState
    created: bool


@dataclass(frozen=True, kw_only=True)
class Restart:
    """What ``SessionService.restart`` did: ``created`` the session, or took it back to ``init``
    (``reopened``: it had expired and was given a new expiry)."""

    state: SessionState
    created: bool
    reopened: bool


@dataclass(frozen=True, kw_only=True)
class ExpiryChange:
    """A moved expiry: the session after, the expiry before, and whether it had expired."""

    state: SessionState
    previous_expires_at: datetime
    reopened: bool


class SessionService:
    """Commands and queries on sessions of one tenant."""

    def __init__(
        self, store: AggregateStore, tenant: str, archived_in: Callable[[str], str | None] | None = None
    ) -> None:
        self._store = store
        self._tenant = tenant
        self._archived_in = archived_in
        """The bundle an archived session's events are in (None: not archived; ``docs/retention.md``)."""

    def session_uuid(self, session_id: str) -> UUID:
        """The aggregate id of a caller's session id in this tenant."""
        return session_uuid(self._tenant, session_id)

    def _write(self, session_id: str, decide: Callable[[UnitOfWork], T], **options: Any) -> T:
        """``AggregateStore.write`` under the session's key, the id checked first: the key's lock
        is taken before ``decide`` runs, and a list or dict there raised "unhashable type"."""
        self.session_uuid(session_id)
        return self._store.write(session_id, decide, **options)

    # -- commands ----------------------------------------------------------------------

    def start(
        self, session_id: str, workflow: str, user_id: str | None, ttl: timedelta, metadata: JsonObject
    ) -> SessionState:
        """Start a session; starting it again with the same workflow and user is a no-op."""
        return self.start_or_get(session_id, workflow, user_id, ttl, metadata).state

    def start_or_get(
        self, session_id: str, workflow: str, user_id: str | None, ttl: timedelta, metadata: JsonObject
    ) -> Start:
        """``start``, saying whether it created the session (REST answers 201 or 200 by it)."""
        require_ttl(ttl)
        require_object("metadata", metadata)  # a repeat too: it would answer without looking
        decide = partial(self._start, session_id, workflow, user_id, ttl, metadata)
        # Most starts are of new sessions: write first, read only when version 1 exists.
        return self._write(session_id, decide, assume_new=True)

    def restart(
        self, session_id: str, workflow: str, user_id: str | None, ttl: timedelta, metadata: JsonObject
    ) -> Restart:
        """Start a session, or take an existing one back to ``init`` as an event of its own
        (``Session.restart``: history and context kept; an expired one lives ``ttl`` from now).
        The metadata is checked whether or not it is used (a restart keeps the session's own)."""
        require_ttl(ttl)
        require_object("metadata", metadata)
        decide = partial(self._restart, session_id, workflow, user_id, ttl, metadata)
        return self._write(session_id, decide, assume_new=True)

    def record_step(self, session_id: str, request: StepRequest) -> StepRecord:
        """Record a step; a known idempotency key returns the step recorded under it.

        The key is checked first: it is the command's id and is looked up in the session's
        key filter, which would fail on a value that is no string (an AttributeError, or a
        TypeError for a list) instead of refusing it.
        """
        if request.idempotency_key is not None:  # (no key: nothing to check, no wrapper to enter)
            with self.owner_first(session_id, request.user_id):
                require_name("idempotency_key", request.idempotency_key)
        # ``_write``'s check of the id, its result kept: the step's decide finds the session by it
        # instead of working it out again (the cache behind ``session_uuid`` hashes a tuple with
        # a UUID in it, in Python).
        aggregate_id = self.session_uuid(session_id)
        decide = partial(self._record, session_id, aggregate_id, request)
        return self._store.write(session_id, decide, command_id=request.idempotency_key)

    def update_context(
        self, session_id: str, update: JsonObject, *, idempotency_key: str | None = None
    ) -> SessionState:
        """Merge keys into the session context. Under an ``idempotency_key`` the update is
        recorded once: sent again it is answered with the session as it stands, recording
        nothing (nor undoing an update made since); the key with another update is refused."""
        key = _optional_key(idempotency_key)
        return self._write(session_id, partial(self._update_context, session_id, update, key), command_id=key)

    def extend(
        self,
        session_id: str,
        ttl: timedelta,
        *,
        reopen_expired: bool = False,
        idempotency_key: str | None = None,
    ) -> ExpiryChange:
        """Add ``ttl`` to the current expiry: a 24 h session extended by 1 h lives 25 h.

        The bound is ``set_expiry``'s: the new expiry may lie at most ``MAX_TTL`` (366 days) after
        now, however many extensions came before; one past it is refused (ValidationError on
        ``ttl``, saying how much can still be added, a ``ttl`` longer than ``MAX_TTL`` too) and
        nothing is recorded. A session that already expired stays expired (SessionExpired),
        unless ``reopen_expired``: then it lives ``ttl`` from now. Under an ``idempotency_key``
        the expiry moves once: a repeat is answered as the first call was (``expiry_moved_under``).
        """
        require_duration("ttl", ttl, maximum=timedelta.max)  # positive; the bound is the session's
        require_flag("reopen_expired", reopen_expired)
        key = _optional_key(idempotency_key)
        decide = partial(self._extend, session_id, ttl, reopen_expired, key)
        return self._write(session_id, decide, command_id=key)

    def set_expiry(
        self,
        session_id: str,
        expires_at: datetime,
        *,
        reopen_expired: bool = False,
        idempotency_key: str | None = None,
    ) -> ExpiryChange:
        """Set the expiry to ``expires_at``, which must lie after now and at most ``MAX_TTL`` ahead.

        The explicit form for shortening a session too. One that already expired stays expired
        (SessionExpired), unless ``reopen_expired``: then it lives until ``expires_at``. Under an
        ``idempotency_key``, a repeat is answered as the first call was.
        """
        require_moment("expires_at", expires_at)
        require_flag("reopen_expired", reopen_expired)
        key = _optional_key(idempotency_key)
        decide = partial(self._set_expiry, session_id, expires_at, reopen_expired, key)
        return self._write(session_id, decide, command_id=key)

    def expire(self, session_id: str) -> bool:
        """Record ``Expired`` when the session is active and its expiry has passed (the engine's
        clock); True when this call recorded it, False for a session still live or closed."""
        return self._write(session_id, partial(self._expire, session_id))

    def complete(self, session_id: str, resolution: JsonObject | str | None) -> SessionState:
        """End the session with a resolution: a JSON object, or a string kept as ``{"resolution": s}``
        (free text: a blank one, or one with NUL, is refused as a reason is; ``require_resolution``);
        None (none given) is ``{}``."""
        payload = {} if resolution is None else require_resolution(resolution)
        return self._write(session_id, partial(self._complete, session_id, payload))

    def abandon(self, session_id: str, reason: str) -> SessionState:
        """Give the session up."""
        return self._write(session_id, partial(self._abandon, session_id, reason))

    def fork(self, session_id: str, at_version: int, new_session_id: str, ttl: timedelta) -> Start:
        """Start ``new_session_id`` as ``session_id`` was at ``at_version`` (``Engine.fork_session``);
        ``created`` False for the same fork sent again (nothing appended)."""
        require_id("new_session_id", new_session_id)
        require_ttl(ttl)
        require_version("at_version", at_version)
        latest = self.get(session_id)
        if latest.erased:
            raise SessionClosed(session_id, "erased")
        if at_version > latest.version:
            raise ValidationError(
                "at_version",
                f"session {session_id!r} has {versions_held(latest.version)}, not {shown(at_version)}",
            )
        if at_version < FORKED_AT and latest.forked_from is not None:
            # A fork's Started and Forked are one append: its version 1 is a state no reader
            # saw (init, no context, no parent), and a fork of it dropped what it was forked with.
            raise ValidationError(
                "at_version",
                f"session {session_id!r} was forked from {latest.forked_from!r}: its version 1 is its"
                f" start before the state it was forked with (version {FORKED_AT}); fork at version"
                f" {FORKED_AT} or later",
            )
        try:
            parent = self.get(session_id, version=at_version)
        except SessionNotFound:  # the parent's events up to at_version were archived
            # The same fork sent again (its answer lost) needs no event of the parent's: it was
            # refused as archived once the parent was, where before it was answered (200).
            fork: Session | None = self._store.load(self.session_uuid(new_session_id))
            if fork is None or (fork.forked_from, fork.forked_at_version) != (session_id, at_version):
                raise
            return Start(state=fork.state().judged_at(self._store.clock()), created=False)
        decide = partial(self._fork, parent, new_session_id, ttl)
        return self._write(new_session_id, decide)

    # -- queries -----------------------------------------------------------------------

    def get(self, session_id: str, version: int | None = None, as_of: datetime | None = None) -> SessionState:
        """The session now, at a version, or as it was at a moment (the longest prefix at or before it).

        Now, an active session whose expiry has passed reads ``expired`` (``SessionState.judged_at``),
        and so does it as of a moment past its expiry: a command at that moment found it expired
        (as of now it read ``active`` where the read now said ``expired``). A version is not a
        moment: it reads as recorded."""
        if version is not None and as_of is not None:
            raise ValidationError("version", "give version or as_of, not both")
        require_version("version", version, optional=True)
        if as_of is not None:
            version = self._version_at(session_id, as_of)
        session: Session | None = self._store.load(self.session_uuid(session_id), version)
        if session is None:
            raise SessionNotFound(session_id)
        if version is not None and session.version < version:
            self._refuse_version_archived(session_id, version)
            raise ValidationError(
                "version", f"session has {versions_held(session.version)}, not {shown(version)}"
            )
        if version is not None and version < FORKED_AT and as_of is None:
            self._refuse_half_made_fork(session_id)
        now = self._store.clock()
        if version is None:  # now, not a version (nor a moment) of the past
            return session.state().judged_at(now)
        if as_of is not None:  # judged at that moment (a moment to come reads as now does)
            return session.state().judged_at(min(as_of, now))
        return session.state()

    def _refuse_half_made_fork(self, session_id: str) -> None:
        """ValidationError when the session is a fork: its version 1 is its Started alone (init,
        no context, no parent), half of the one append that made it, a state no reader could see.
        ``GET /v1/sessions/{id}?version=1`` of a fork answered it as the fork's start. (A moment
        never lands there: both events carry the append's one timestamp.)"""
        whole: Session | None = self._store.load(self.session_uuid(session_id), FORKED_AT)
        if whole is not None and whole.forked_from is not None:
            raise ValidationError(
                "version",
                f"session {session_id!r} was forked from {whole.forked_from!r}: its version 1 is its"
                f" start before the state it was forked with (version {FORKED_AT}); read version"
                f" {FORKED_AT} or later",
            )

    def _bundle_of(self, session_id: str) -> str | None:
        """The bundle retention archived the session's events to; None when its first event is
        stored (one read on the engine's pool: retention's own read opens a connection, which
        cost every new key of a keyed context update some milliseconds) or retention is not there."""
        if self._archived_in is None or self._store.events(self.session_uuid(session_id), lte=1):
            return None
        return self._archived_in(session_id)

    def _refuse_version_archived(self, session_id: str, version: int) -> None:
        """SessionArchived when retention archived the session's events up to ``version`` or past
        it: the read stopped at the last snapshot before the gap (an engine's snapshot at version
        3 of a session of 9 read as "session has 3 versions, not 4")."""
        bundle = self._bundle_of(session_id)
        if bundle is not None:
            head: Session | None = self._store.load(self.session_uuid(session_id))
            if head is not None and head.version >= version:
                raise SessionArchived(session_id, bundle)

    def ensure_owner(self, session_id: str, claimed: str | None) -> None:
        """SessionOwnedByAnother when the session (loaded) has a user other than ``claimed``;
        SessionNotFound when there is none. For a request refused before its step loads the
        session: the edges checked ownership first, and still tell it first (``owner_first``)."""
        if claimed is not None:
            require_owner(session_id, self.get(session_id).user_id, claimed)

    @contextmanager
    def owner_first(self, session_id: str, claimed: str | None) -> Iterator[None]:
        """Around the checks a step makes before its write: a request that claims a user and is
        refused by one is told first what the session's ownership says, as when the edges loaded
        the session to check it before the step. Only a refused request loads it here; the
        others are checked on the session their step loads (``require_owner`` in its decide)."""
        try:
            yield
        except FlowledgerError:
            self.ensure_owner(session_id, claimed)
            raise

    def history(self, session_id: str) -> list[HistoryEntry]:
        """The session's events, oldest first."""
        events = self._store.events(self.session_uuid(session_id))
        if not events:
            raise SessionNotFound(session_id)
        return [history_entry(event) for event in events]

    def steps(self, session_id: str) -> list[StepRecord]:
        """Every processed step of the session, oldest first (state keeps only the recent ones)."""
        events = self._store.events(self.session_uuid(session_id))
        if not events:
            raise SessionNotFound(session_id)
        return [StepRecord.of(event) for event in events if isinstance(event, Session.StepProcessed)]

    def find_outcome(self, session: Session, key: str | None) -> StepRecord | None:
        """The step recorded under ``key``: from state when it is recent, else from the stream."""
        if key is None:
            return None
        found = session.outcome_lookup(key)
        if isinstance(found, StepRecord):
            return found
        if found is not MAYBE_SEEN:
            return None
        processed = self._events_under(session, Session.StepProcessed, key)
        return StepRecord.of(processed[0]) if processed else None

    def outcome_of_request(
        self,
        session: Session,
        key: str | None,
        step: str,
        input: JsonObject,
        *,
        model: ModelAsked | None = None,
        **rest: Any,
    ) -> StepRecord | None:
        """``find_outcome`` for a request under ``key``, which must be the request the key was
        used for (``Session.ensure_same_request``: the step name, ``input``, the ``model`` and
        the ``rest`` of its payload): the recorded step, or None when none was processed under
        the key. A key whose step failed is checked against its last ``StepStarted`` (name,
        input and model); one that moved the expiry or named a context update is refused
        (IdempotencyKeyOfAnotherKind). The key filter is consulted once: a new key reads nothing."""
        if key is None:
            return None
        found = session.outcome_lookup(key)
        if found is NOT_SEEN and not session.keys_filtered:  # an old snapshot's filter holds no
            self._learn_filtered_keys(session)  # move's (or update's) key: read them once
            found = session.outcome_lookup(key)
        if isinstance(found, StepRecord):
            record = found
        elif found is NOT_SEEN:
            # Certain for every kind but when the filter could not learn them (an archived
            # stream's older base) or the key has the shape of an id the engine made (the
            # filter leaves those out for context updates): the stored events settle it.
            if not session.keys_filtered or made_by_engine(key):
                refuse_other_kinds_for_step(session, key, self.events_holding, step)
            return None
        else:  # MAYBE_SEEN: the stream settles it
            processed = self._events_under(session, Session.StepProcessed, key)
            if not processed:
                started = [] if session.erased else self._events_under(session, Session.StepStarted, key)
                if started:
                    held = PendingStep.of(started[-1])
                    session.ensure_same_request(held, key, step, model=model, input=input)
                else:
                    # The stored events first: a key another kind of request used since a
                    # restart of an archived session is refused as such, not as archived.
                    refuse_other_kinds_for_step(session, key, self.events_holding, step)
                    self._refuse_key_archived(session, key)
                return None
            record = StepRecord.of(processed[0])
        session.ensure_same_request(record, key, step, model=model, input=input, **rest)
        return record

    def _refuse_key_archived(self, session: Session, key: str, what: str = "the step") -> None:
        """SessionArchived when retention archived the session's events: the key may name a
        step (a context update, an expiry change) in them (the stored rows do not hold it), and
        taken as new it was recorded a second time (a session archived, then restarted: a step
        charged twice, an old update applied over newer values). Restore, then retry."""
        bundle = self._bundle_of(session.session_id)
        if bundle is not None:
            raise SessionArchived(
                session.session_id,
                bundle,
                f"{what} under idempotency key {key!r}",
            )

    def _learn_filtered_keys(self, session: Session) -> None:
        """Put the command ids of the session's moves of the expiry and context updates in its
        key filter (the kinds its older snapshot's filter lacks), read from the stream in one
        search per kind (``Session.learn_filtered_keys``). Not for a stream whose first events
        retention archived: their keys are in the bundle, and a filter that says it holds every
        key must (its snapshots would say so too); the stored events are searched per key then."""
        if not self._store.events(session.id, lte=1):
            return
        moves = () if session.expiry_keys_filtered else (Session.Extended, Session.Reopened)
        updates = () if session.context_keys_filtered else (Session.ContextUpdated,)
        session.learn_filtered_keys(self._command_ids(session, moves), self._command_ids(session, updates))

    def _command_ids(self, session: Session, kinds: tuple[type[Any], ...]) -> list[str]:
        """The command ids of the session's events of ``kinds``, one search of the stream per kind."""
        needle = b'"command_id":"'
        return [
            key
            for kind in kinds
            for event in self._store.events_containing(session.id, kind, needle)
            if (key := command_id_of(event)) is not None
        ]

    def _events_under(self, session: Session, event_class: type[Any], key: str) -> list[Any]:
        """The session's events of ``event_class`` under ``key``, oldest first. Rare (the key
        filter cannot rule the key out: a key older than the recent window, a failed step's,
        or a false positive): the stream is searched for the key's bytes as the JSON
        transcoder writes them, and each match decoded to be sure."""
        found = self.events_holding(session, event_class, "idempotency_key", key)
        return [event for event in found if event.idempotency_key == key]

    def events_holding(self, session: Session, event_class: type[Any], field: str, value: str) -> list[Any]:
        """The session's events of ``event_class`` whose stored JSON holds ``field`` set to
        ``value`` as the transcoder writes it (a search of the stream's bytes: the caller
        checks each match it decodes)."""
        needle = f'"{field}":'.encode() + json.dumps(value, ensure_ascii=False).encode()
        return self._store.events_containing(session.id, event_class, needle)

    # -- decisions (run by the store, once per attempt) ----------------------------------

    def _start(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None,
        ttl: timedelta,
        metadata: JsonObject,
        uow: UnitOfWork,
    ) -> Start:
        existing: Session | None = uow.find(self.session_uuid(session_id))
        if existing is not None:
            existing.ensure_same_start(workflow=workflow, user_id=user_id)
            # Answered as a read answers it: an overdue session is expired, not 'active'.
            return Start(state=existing.state().judged_at(uow.now), created=False)
        session = Session.start(
            session_id=session_id,
            tenant=self._tenant,
            workflow=workflow,
            user_id=user_id,
            expires_at=uow.now + ttl,
            metadata=metadata,
        )
        uow.add(session)
        return Start(state=session.state(), created=True)

    def _restart(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None,
        ttl: timedelta,
        metadata: JsonObject,
        uow: UnitOfWork,
    ) -> Restart:
        existing: Session | None = uow.find(self.session_uuid(session_id))
        if existing is None:
            started = self._start(session_id, workflow, user_id, ttl, metadata, uow)
            return Restart(state=started.state, created=True, reopened=False)
        reopened = existing.restart(workflow=workflow, user_id=user_id, now=uow.now, expires_at=uow.now + ttl)
        return Restart(state=existing.state(), created=False, reopened=reopened)

    def _fork(self, parent: SessionState, new_session_id: str, ttl: timedelta, uow: UnitOfWork) -> Start:
        existing: Session | None = uow.find(self.session_uuid(new_session_id))
        if existing is not None:
            if (existing.forked_from, existing.forked_at_version) == (parent.session_id, parent.version):
                # The same fork sent again (its answer lost): answered as start_session's repeat is.
                return Start(state=existing.state().judged_at(uow.now), created=False)
            raise SessionConflict(new_session_id, "a session with this id exists; a fork needs a new id")
        child = Session.start(
            session_id=new_session_id,
            tenant=self._tenant,
            workflow=parent.workflow,
            user_id=parent.user_id,
            expires_at=uow.now + ttl,
            metadata={
                **parent.metadata,
                "forked_from": parent.session_id,
                "forked_at_version": parent.version,
            },
        )
        uow.add(child)
        uow.adopt(child)
        child.fork_from(
            parent_session_id=parent.session_id,
            parent_version=parent.version,
            current_step=parent.current_step,
            context=parent.context,
        )
        return Start(state=child.state(), created=True)

    def _record(
        self, session_id: str, aggregate_id: UUID, request: StepRequest, uow: UnitOfWork
    ) -> StepRecord:
        session = self._session_by(uow, session_id, aggregate_id)
        require_owner(session_id, session.user_id, request.user_id)
        recorded = self.outcome_of_request(
            session,
            request.idempotency_key,
            request.step,
            request.input,
            output=request.output,
            next_step=request.next_step,
            context_update=request.context_update,
            usage=request.usage,  # another call reported under the key is another request
        )
        if recorded is not None:
            return recorded
        session.ensure_open(uow.now)
        # The caller's usage, not a provider's report: its names are held to a name's rule.
        require_given_usage("usage", request.usage)
        return session.record_step(
            step=request.step,
            input=request.input,
            output=request.output,
            next_step=request.next_step,
            context_update=request.context_update,
            usage=request.usage,
            idempotency_key=request.idempotency_key,
        )

    def _update_context(
        self, session_id: str, update: JsonObject, key: str | None, uow: UnitOfWork
    ) -> SessionState:
        session = self._session(uow, session_id)
        if key is not None:
            if context_updated_under(session, key, update, self.events_holding):
                return session.state()
            # A key the filter may hold (or an older snapshot's filter, which holds no update's
            # key) may name a request recorded before the session was archived, in its bundle:
            # taken as new, an update retried after a restart was applied over newer values. One
            # it rules out is new: an archived session's base folds every event (state version
            # 7), and a new key had been refused until a restore.
            if session.may_have_named(key):
                self._refuse_key_archived(session, key, "the context update")
        session.ensure_open(uow.now)
        session.update_context(update, keyed=key is not None)
        return session.state()

    def _extend(
        self, session_id: str, ttl: timedelta, reopen_expired: bool, key: str | None, uow: UnitOfWork
    ) -> ExpiryChange:
        session = self._session(uow, session_id)
        repeat = self._expiry_moved_under(session, key, uow.now, by=ttl)
        if repeat is not None:
            return repeat
        # The bound set_expiry holds to, on the same clock: repeated extensions would otherwise
        # push the expiry years ahead. A session reopened lives ttl from now instead.
        limit = uow.now + MAX_TTL
        reopening = reopen_expired and session.expired_by(uow.now)
        base = uow.now if reopening else session.expires_at
        if ttl > limit - base:  # compared as durations: base + ttl may lie past year 9999
            if not reopening:
                # Past the bound the session has not expired (its expiry lies after now), so
                # this records nothing: it refuses a completed, abandoned or erased session first.
                session.ensure_open(uow.now)
            raise ValidationError("ttl", _beyond_bound(base, ttl, limit))
        return self._move_expiry(session, uow.now, session.expires_at + ttl, uow.now + ttl, reopen_expired)

    def _move_expiry(
        self, session: Session, now: datetime, expires_at: datetime, reopen_at: datetime, reopen: bool
    ) -> ExpiryChange:
        """Extend an open session to ``expires_at``, or reopen an expired one until ``reopen_at``."""
        previous = session.expires_at
        if reopen and session.expired_by(now):
            session.reopen(now=now, expires_at=reopen_at)
            return ExpiryChange(state=session.state(), previous_expires_at=previous, reopened=True)
        session.ensure_open(now)
        session.extend(expires_at)
        return ExpiryChange(state=session.state(), previous_expires_at=previous, reopened=False)

    def _set_expiry(
        self, session_id: str, expires_at: datetime, reopen_expired: bool, key: str | None, uow: UnitOfWork
    ) -> ExpiryChange:
        if key is not None:  # a repeat is answered even once the moment it set has passed
            repeat = self._expiry_moved_under(self._session(uow, session_id), key, uow.now, to=expires_at)
            if repeat is not None:
                return repeat
        # Checked against the store's clock, inside the unit of work: the same clock that
        # later decides whether the session expired.
        if expires_at <= uow.now:
            got = f"now is {uow.now.isoformat()}, got {expires_at.isoformat()}"
            raise ValidationError("expires_at", f"must lie in the future ({got})")
        if expires_at > uow.now + MAX_TTL:
            raise ValidationError(
                "expires_at", f"must lie at most {MAX_TTL.days} days ahead, got {expires_at.isoformat()}"
            )
        session = self._session(uow, session_id)
        return self._move_expiry(session, uow.now, expires_at, expires_at, reopen_expired)

    def _expiry_moved_under(
        self,
        session: Session,
        key: str | None,
        now: datetime,
        *,
        by: timedelta | None = None,
        to: datetime | None = None,
    ) -> ExpiryChange | None:
        """The change an earlier extension (``by``) or ``set_expiry`` (``to``) under ``key`` made,
        as it was answered then (the expiry before it read at the version before), or None when
        no move of the expiry carries the key as its command id. Another move under the key (another
        ``ttl``, another moment) is refused (IdempotencyKeyReused), and so is a key that named a
        step (IdempotencyKeyOfAnotherKind). A retry after a lost answer
        extended twice: the command had no key, its id was made afresh by each call."""
        if key is None:
            return None
        # The filter holds every move's key (state version 6): a key it rules out moved nothing,
        # and the stream is not searched. Two searches an attempt had widened the window
        # between read and save: 64 engines extending one session under keys lost 65 races in
        # a row 5 times in 384 calls, where unkeyed extensions lost none.
        filtered_out = not session.may_have_moved_expiry(key)
        moves = [] if filtered_out else expiry_moves_under(session, key, self.events_holding)
        if not moves:
            refuse_update_key_for_expiry(session, key, self.events_holding)
            refuse_step_key_for_expiry(session, key, self.events_holding)
            if not filtered_out:
                self._refuse_key_archived(session, key, "the expiry change")
            return None
        move = moves[0]
        before: Session | None = self._store.load(session.id, move.originator_version - 1)
        previous = before.expires_at if before is not None else move.expires_at
        reopened = isinstance(move, Session.Reopened)
        if to is not None and move.expires_at != to:
            raise IdempotencyKeyReused(
                session.session_id, key, "expiry change", "expires_at", named=EXPIRY_CHANGE
            )
        if by is not None and not reopened and previous + by != move.expires_at:
            raise IdempotencyKeyReused(session.session_id, key, "expiry change", "ttl", named=EXPIRY_CHANGE)
        return ExpiryChange(
            state=session.state().judged_at(now), previous_expires_at=previous, reopened=reopened
        )

    def _expire(self, session_id: str, uow: UnitOfWork) -> bool:
        session = self._session(uow, session_id)
        was_active = session.status == SessionStatus.ACTIVE
        return session.expired_by(uow.now) and was_active

    def _complete(self, session_id: str, resolution: JsonObject, uow: UnitOfWork) -> SessionState:
        session = self._session(uow, session_id)
        if session.completed_with(resolution):  # a retry whose first answer was lost
            return session.state()
        session.ensure_open(uow.now)
        session.complete(resolution)
        return session.state()

    def _abandon(self, session_id: str, reason: str, uow: UnitOfWork) -> SessionState:
        session = self._session(uow, session_id)
        if session.status == SessionStatus.ABANDONED and self._abandoned_for(session, reason):
            return session.state()  # a retry whose first answer was lost
        session.ensure_open(uow.now)
        session.abandon(reason)
        return session.state()

    def _abandoned_for(self, session: Session, reason: str) -> bool:
        """Whether ``session`` was abandoned for exactly ``reason`` (read from its last
        ``Abandoned`` event: the state keeps no reason, which is personal data)."""
        if session.erased:
            return False
        events = self._store.events(session.id, gt=max(session.version - 8, 0))  # it ended the stream
        ended = next((e for e in reversed(events) if isinstance(e, Session.Abandoned)), None)
        return ended is not None and ended.reason == reason

    def _session(self, uow: UnitOfWork, session_id: str) -> Session:
        return self._session_by(uow, session_id, self.session_uuid(session_id))

    @staticmethod
    def _session_by(uow: UnitOfWork, session_id: str, aggregate_id: UUID) -> Session:
        """``_session`` with the id already worked out (``session_uuid(session_id)``)."""
        session: Session | None = uow.find(aggregate_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def _version_at(self, session_id: str, as_of: datetime) -> int:
        """The last version of the longest prefix of events stamped at or before ``as_of``
        (SessionNotYetStarted, a SessionNotFound, when the session began after ``as_of``)."""
        require_moment("as_of", as_of)
        found = self._store.version_at(self.session_uuid(session_id), as_of)
        if found is None:
            raise SessionNotFound(session_id)
        if found.version == 0:
            raise SessionNotYetStarted(session_id, as_of, found.first_stamp)
        return found.version


def _optional_key(idempotency_key: str | None) -> str | None:
    """A caller's key checked as a name (it becomes the command's id), or None."""
    return None if idempotency_key is None else require_name("idempotency_key", idempotency_key)


def _beyond_bound(base: datetime, ttl: timedelta, limit: datetime) -> str:
    """Why adding ``ttl`` to an expiry of ``base`` is refused, and how much it can still take."""
    room = timedelta(seconds=int((limit - base).total_seconds()))
    can_add = f"at most {room} can still be added" if room > timedelta(0) else "nothing can be added"
    try:
        would = f"the expiry would be {(base + ttl).isoformat()}"
    except OverflowError:
        would = f"the expiry would lie {ttl.days} days on, past the year {datetime.max.year}"
    return f"{would}, and must lie at most {MAX_TTL.days} days ahead (until {limit.isoformat()}): {can_add}"
