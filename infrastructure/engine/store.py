"""The one write path for every aggregate: load, decide, save, snapshot, retry, lock, cache.

A command runs as ``store.write(lock_key, decide)``: ``decide`` gets a ``UnitOfWork``,
loads or adds the aggregates it needs through it and calls their methods; the store
then saves every new event of every touched aggregate in one atomic append.

Every command has one id (the caller's idempotency key, or one made here before the
first attempt), carried by each event it writes (``domain/aggregate.py``). That is what
makes a retry safe when the outcome of an append is unknown (the commit happened but
its reply was lost, or the connection broke mid-commit): before deciding again, the
store reads the stream after the version it wrote at and, finding its own command id
there, returns the result of the attempt that committed instead of writing it twice.

Other failures:
- a version clash (another writer first) retries against fresh state with jittered
  exponential backoff, up to ``max_conflict_retries``, then ``ConcurrentUpdate``;
- an unreachable database retries until ``operation_deadline_s``, then
  ``StoreUnavailable`` (the caller may retry with the same key); a statement still running
  then is ended by the statement watchdog (``postgres/watchdog.py``). When the last save's
  outcome is still unknown then, ``StoreUnavailable.outcome_unknown`` says so: only a retry
  with the same key is then sure to store the command once;
- a closed engine refuses every read and write at once (``EngineClosed``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from contextvars import ContextVar
from datetime import datetime
from functools import partial
from itertools import pairwise
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import OriginatorVersionError
from eventsourcing.persistence import IntegrityError, InterfaceError, OperationalError
from eventsourcing.utils import get_topic

from flowledger.domain.aggregate import FlowledgerAggregate, command_id_of
from flowledger.domain.errors import (
    AgentError,
    ConcurrentUpdate,
    SessionError,
    SessionExpired,
    StoredEventMissing,
    StoredEventUnreadable,
    StoreUnavailable,
    TaskError,
)
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.cache_weights import CacheWeights
from flowledger.infrastructure.engine.command_ids import new_command_id
from flowledger.infrastructure.engine.keyed_locks import KeyedLocks, LockWaitTimeout
from flowledger.infrastructure.engine.version_at import VersionAt, version_at
from flowledger.infrastructure.engine.write_cache import WriteCache
from flowledger.infrastructure.operation_deadline import operation_deadline, remaining_s
from flowledger.infrastructure.outages import jittered, within_deadline
from flowledger.infrastructure.postgres.database import PRIVILEGE_ERRORS, forbidden, refused_privilege
from flowledger.infrastructure.postgres.not_sent import AppendNotSent
from flowledger.infrastructure.settings import Settings

T = TypeVar("T")
_log = logging.getLogger(__name__)
A = TypeVar("A", bound=FlowledgerAggregate)
Clock = Callable[[], datetime]

UNREACHABLE = (OperationalError, InterfaceError)
"""The library's errors for a database that did not answer (the recorder maps psycopg's)."""

current_actor: ContextVar[str | None] = ContextVar("flowledger_actor", default=None)
"""Who the commands running in this context act for (an API key's id); set by ``Engine.acting_as``."""

KEEPS_EVENTS = (SessionExpired,)
"""Errors raised after the aggregate recorded why (Expired): save those events, then raise."""

STATE_REFUSALS = (SessionError, TaskError, AgentError)
"""The domain's refusals that depend on an aggregate's state. Decided on a cached copy, one
may be stale: another process moved the aggregate on (a task it assigned, found "pending"
here), so the command is decided once more on state read from the log before it is refused.
So is one decided on several aggregates, even all read from the log: they were read one after
the other, and another process may have written between the reads (a task read "assigned",
then its agent read after another server completed it: "does not hold" instead of
"completed")."""

_BACKOFF_BASE_S = 0.002
_BACKOFF_CAP_S = 0.1
_UNREACHABLE_PAUSE_S = 0.2


def loaded(app: FlowledgerApplication, aggregate_id: UUID, version: int | None = None) -> Any:
    """The aggregate at ``version`` (latest by default) from the application's repository (its
    latest snapshot, then its later events), or folded from its events alone when that load does
    not read back. Every load of an aggregate goes through here: the engine's store, and the task
    index's read of an agent another engine registered.

    Not reading back: a row that does not decode (``StoredEventUnreadable``), and an aggregate
    that does not fold from its snapshot or whose state then does not read. A snapshot edited in
    the database so that it still parses but lacks a field raised a bare AttributeError out of
    ``get_session`` (HTTP 500): a session's ``status`` removed, from its ``state()``, or its
    ``totals``, from applying the events after the snapshot; an agent's held tasks cut short, a
    ValueError. The events are the record: an error that folding them meets too is raised from
    there, as ``StoredEventUnreadable`` naming the event that does not fold."""
    try:
        aggregate: Any = app.repository.get(aggregate_id, version=version)
        state = getattr(aggregate, "state", None)
        if callable(state):
            state()
    except (StoredEventUnreadable, *_DOES_NOT_FOLD) as error:
        return _folded_from_events(app, aggregate_id, version, error)
    if getattr(aggregate, "refold", False):
        return _refolded(app, aggregate_id, version, aggregate)
    return aggregate


def _refolded(app: FlowledgerApplication, aggregate_id: UUID, version: int | None, aggregate: Any) -> Any:
    """The aggregate folded from its events alone, for a state read from a snapshot that knows
    less than they say (``refold``: a session's totals without cache writes, state version 6):
    until its next snapshot, each load of such a stream folds its events. A stream whose first
    events were archived has nothing else to fold from: its state stays as the snapshot reads."""
    events: list[Any] = list(app.events.get(aggregate_id, lte=version))
    if not events or events[0].originator_version != 1:
        return aggregate
    return _fold(aggregate_id, events)


_MANY = 500
"""Streams read in one statement by ``AggregateStore.folded_many``."""
_DOES_NOT_FOLD = (AttributeError, KeyError, TypeError, ValueError)
"""What applying an event whose row was edited raises (a priority "urgent", skills null): the
event decodes (the library sets its fields without checking them), and its aggregate cannot take it."""


def _does_not_apply(aggregate_id: UUID, event: Any, failure: Exception) -> StoredEventUnreadable:
    """The load's error for an event that decodes but does not fold: a bare ValueError or
    TypeError out of every read and write of the aggregate was an anonymous HTTP 500."""
    reason = f"it does not fold into its aggregate: {type(failure).__name__}: {failure}"
    return StoredEventUnreadable(str(aggregate_id), event.originator_version, get_topic(type(event)), reason)


def _fold(aggregate_id: UUID, events: list[Any]) -> Any:
    """``events`` folded into their aggregate, its state read (None: no events); an event
    that does not fold (a value edited in its row) is ``StoredEventUnreadable`` naming it."""
    aggregate: Any = None
    for event in events:
        try:
            aggregate = event.mutate(aggregate)
        except _DOES_NOT_FOLD as failure:
            raise _does_not_apply(aggregate_id, event, failure) from failure
    state = getattr(aggregate, "state", None)
    try:
        if callable(state):
            state()
    except _DOES_NOT_FOLD as failure:
        raise _does_not_apply(aggregate_id, events[-1], failure) from failure
    return aggregate


def _folded_from_events(
    app: FlowledgerApplication, aggregate_id: UUID, version: int | None, error: Exception
) -> Any:
    """The aggregate folded from its events alone, when a load did not read back (``loaded``).

    The row may be its snapshot, which is derived data (``audit verify`` compares it with
    the fold of its events): a snapshot changed in the database made the session unreadable and
    unwritable, with an error that pointed at ``audit verify``, which found nothing. An
    event row that does not read raises again here, naming itself. A stream whose first events
    are gone (archived by retention: its snapshot was its whole state) has nothing to fold
    from: the snapshot's own error is raised (a sealed one edited, say), not "not found"."""
    events: list[Any] = list(app.events.get(aggregate_id, lte=version))
    if (not events or events[0].originator_version != 1) and isinstance(error, StoredEventUnreadable):
        raise error
    aggregate = _fold(aggregate_id, events)
    if aggregate is None:
        raise AggregateNotFoundError(aggregate_id)
    _log.warning("stream %s: its snapshot does not read back; folded from its events", aggregate_id)
    return aggregate


class UnitOfWork:
    """The aggregates one attempt of a command touched; saved together, atomically."""

    __slots__ = (
        "_assume_new",
        "_store",
        "actor",
        "command_id",
        "fresh",
        "from_cache",
        "now",
        "read_versions",
        "touched",
        "transaction",
    )

    def __init__(
        self,
        command_id: str,
        now: datetime,
        store: AggregateStore,
        *,
        assume_new: bool = False,
        actor: str | None = None,
        fresh: bool = False,
    ) -> None:
        self.command_id = command_id
        self.now = now
        self.actor = actor
        self._store = store
        self._assume_new = assume_new
        self.fresh = fresh
        """Read every aggregate from the store, none from the writers' cache (a command decided
        again after it was refused, or found nothing to do, on cached copies)."""
        self.touched: dict[UUID, FlowledgerAggregate] = {}
        self.transaction: Any = None
        """An open database transaction the save is to be made and committed in (it holds
        locks the command took, ``agent_locks.py``); None saves on a connection of its own."""
        self.from_cache = False
        """Whether an aggregate came from the writer's cache (possibly behind another process)."""
        self.read_versions: dict[UUID, int] = {}
        """The version each existing aggregate was read at (``AggregateStore._moved_on``)."""

    def find(self, aggregate_id: UUID) -> Any | None:
        """The aggregate (taken out of the writers' cache, or loaded), opened for this command;
        None when it does not exist. Taken, not shared: until this command's save puts it
        back, another command of this engine reads the aggregate from the store."""
        # (Looked up only when something is held: a UUID's hash runs in Python, and a command
        # usually finds one aggregate, in an empty map.)
        held = self.touched.get(aggregate_id) if self.touched else None
        if held is not None:
            return held
        aggregate = None if self.fresh else self._store.take_cached(aggregate_id)
        if aggregate is not None:
            self.from_cache = True
        elif not self._assume_new:
            aggregate = self._store.load(aggregate_id)
        if aggregate is not None:
            self.read_versions[aggregate_id] = aggregate.version
            aggregate.begin(self.command_id, self.now, self.actor)
            self.touched[aggregate_id] = aggregate
        return aggregate

    def add(self, aggregate: FlowledgerAggregate) -> None:
        """A just-created aggregate, saved with the rest (its first event takes this command)."""
        aggregate.tag_creation(self.command_id, self.now, self.actor)
        self.touched[aggregate.id] = aggregate

    def adopt(self, aggregate: FlowledgerAggregate) -> None:
        """An aggregate loaded elsewhere (a follower's copy), opened for this command."""
        self.read_versions[aggregate.id] = aggregate.version
        aggregate.begin(self.command_id, self.now, self.actor)
        self.touched[aggregate.id] = aggregate

    def close(self) -> None:
        """End the command on every touched aggregate."""
        for aggregate in self.touched.values():
            aggregate.end()


class AggregateStore:
    """Loads and saves Session, Task and Agent aggregates through one path."""

    def __init__(
        self, app: FlowledgerApplication, settings: Settings, clock: Clock, *, cache_size: int | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.clock = clock
        self._locks = KeyedLocks()
        self._conflicts_lock = threading.Lock()
        self.conflicts = 0
        """Saves lost to another writer (a version clash) since the store was built."""
        self.saved_listeners: list[Callable[[FlowledgerAggregate], None]] = []
        """Called with every aggregate a command saved, after the save (read-only use)."""
        self._cache: WriteCache[FlowledgerAggregate] = WriteCache(
            settings.write_cache_size if cache_size is None else cache_size,
            max_bytes=settings.write_cache_bytes,
            weigh=CacheWeights().weigh,
        )

    # -- reads -----------------------------------------------------------------------

    def load(self, aggregate_id: UUID, version: int | None = None) -> Any | None:
        """The aggregate at ``version`` (latest by default), or None; StoreUnavailable past the deadline."""

        def get() -> Any | None:
            try:
                return loaded(self.app, aggregate_id, version)
            except AggregateNotFoundError:
                return None
            except OriginatorVersionError as error:  # (found, expected): a row deleted between them
                found, expected = (*error.args, 0, 0)[:2]
                raise StoredEventMissing(str(aggregate_id), int(expected), int(found)) from None
            except AssertionError:
                # The library asserts that a stream with no snapshot opens with its creation
                # event: its first row deleted surfaced as a bare AssertionError (HTTP 500, exit 70).
                first = self.app.recorder.select_events(aggregate_id, limit=1)
                if first and first[0].originator_version > 1:
                    raise StoredEventMissing(str(aggregate_id), 1, first[0].originator_version) from None
                raise

        return self._read("load", get)

    def folded_many(self, aggregate_ids: Sequence[UUID]) -> dict[UUID, Any]:
        """The latest of many aggregates (a listing, a queue run), their events read together,
        ``_MANY`` streams a statement: ``list_tasks`` loaded 1,500 tasks one at a time, two round
        trips each (a snapshot's and the events'), 2.1-2.9 s on a quiet machine and 8-11 s under
        load. Left out: an aggregate whose events do not fold that way (none stored, a version
        missing, a row that does not read, a snapshot past events archived), for the caller to
        ``load`` alone when it comes to it, so that it reads or fails exactly as there."""
        select_streams: Callable[[Sequence[UUID]], list[Any]] | None = getattr(
            self.app.recorder, "select_streams", None
        )
        if select_streams is None:  # in memory: no round trips to save
            return {}
        found: dict[UUID, Any] = {}
        for start in range(0, len(aggregate_ids), _MANY):
            batch = aggregate_ids[start : start + _MANY]
            by_stream: dict[UUID, list[Any]] = {}
            for row in self._read("load", partial(select_streams, batch)):
                by_stream.setdefault(row.originator_id, []).append(row)
            for aggregate_id, stored in by_stream.items():
                folded = self._folded(stored)
                if folded is not None:
                    found[aggregate_id] = folded
        return found

    def _folded(self, stored: list[Any]) -> Any | None:
        """An aggregate folded from all its stored events (versions 1 to n), else None."""
        if not stored or [s.originator_version for s in stored] != list(range(1, len(stored) + 1)):
            return None
        try:
            events = [self.app.mapper.to_domain_event(row) for row in stored]
            return _fold(stored[0].originator_id, events)
        except StoredEventUnreadable:
            return None

    def version_at(self, aggregate_id: UUID, moment: datetime) -> VersionAt | None:
        """The aggregate's last version stamped at or before ``moment`` (``version_at.py``)."""
        app = self.app
        return self._read("read events", lambda: version_at(app.recorder, app.mapper, aggregate_id, moment))

    def events(self, aggregate_id: UUID, *, gt: int | None = None, lte: int | None = None) -> list[Any]:
        """The aggregate's stored events, oldest first (optionally a version range); a version
        missing between two of them, or before the first (a row deleted), is
        ``StoredEventMissing``, as a load's is."""
        events = self._read("read events", lambda: list(self.app.events.get(aggregate_id, gt=gt, lte=lte)))
        first = (gt or 0) + 1
        if events and events[0].originator_version != first:  # the first rows deleted
            raise StoredEventMissing(str(aggregate_id), first, events[0].originator_version)
        for before, after in pairwise(events):
            if after.originator_version != before.originator_version + 1:
                expected = before.originator_version + 1
                raise StoredEventMissing(str(aggregate_id), expected, after.originator_version)
        return events

    def events_containing(self, aggregate_id: UUID, event_class: type[Any], needle: bytes) -> list[Any]:
        """The aggregate's events of ``event_class`` whose stored form contains ``needle``.

        PostgreSQL searches server side; other recorders filter the stream's stored bytes.
        """
        topic = get_topic(event_class)
        recorder = self.app.recorder

        def search() -> list[Any]:
            server_side = getattr(recorder, "select_events_containing", None)
            if server_side is not None:
                stored = server_side(aggregate_id, topic, needle)
            else:
                every = recorder.select_events(aggregate_id)
                stored = [s for s in every if s.topic == topic and needle in s.state]
            return [self.app.mapper.to_domain_event(s) for s in stored]

        return self._read("search events", search)

    def _read(self, operation: str, read: Callable[[], T]) -> T:
        """``read()`` on an open engine, tried again after a connection error until the
        operation's deadline (``within_deadline``: then StoreUnavailable, or StoreRefused at
        once for a refused login). Reads only: they may run twice."""

        def attempt() -> T:
            self.app.ensure_open(operation)  # checked on every try: a retry stops at close
            return read()

        return within_deadline(operation, self.settings.operation_deadline_s, attempt)

    def cached(self, aggregate_id: UUID) -> FlowledgerAggregate | None:
        """The writer's cached copy, or None (nothing is read); only to look at, never to change."""
        return self._cache.get(aggregate_id)

    def cached_bytes(self) -> int:
        """What the writers' cached aggregates weigh together (``cache_weights.py``)."""
        return self._cache.held_bytes

    def take_cached(self, aggregate_id: UUID) -> FlowledgerAggregate | None:
        """The writer's cached copy, removed from the cache for one command to change and
        save (``write`` puts it back after the save), or None."""
        return self._cache.take(aggregate_id)

    def evict(self, aggregate_ids: Iterable[UUID]) -> None:
        """Drop the writers' cached copies: the next command on each reads the store."""
        for aggregate_id in aggregate_ids:
            self._cache.evict(aggregate_id)

    def cached_or_loaded(self, aggregate_id: UUID) -> FlowledgerAggregate | None:
        """The writer's copy: from the cache (trusted: saves are optimistic) or the store."""
        self.app.ensure_open("load")
        cached = self._cache.get(aggregate_id)
        if cached is not None:
            return cached
        loaded: FlowledgerAggregate | None = self.load(aggregate_id)
        return loaded

    @contextmanager
    def locked(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold the in-process locks of several keys (taken in sorted order, so two callers
        cannot deadlock), for a ``write`` that touches aggregates under other keys."""
        with ExitStack() as stack:
            for key in sorted(set(keys)):
                stack.enter_context(self._locks(key))
            yield

    # -- the write path --------------------------------------------------------------

    def write(
        self,
        lock_key: str,
        decide: Callable[[UnitOfWork], T],
        *,
        command_id: str | None = None,
        assume_new: bool = False,
        conflict_retries: int | None = None,
        now: datetime | None = None,
    ) -> T:
        """Run ``decide`` and save what it changed; exactly once, retried as the module says.

        ``assume_new`` lets the first attempt skip reading (creations that are usually
        new); a clash on version 1 then retries with reads. ``now``: the moment the events are
        stamped with (never before the stream's last stamp), for a command whose moment was
        decided before it (a model call's settlement); None: the clock's, at each attempt.
        """
        command = command_id or new_command_id()
        budget = self.settings.max_conflict_retries if conflict_retries is None else conflict_retries
        unknown: dict[tuple[UUID, int], T] = {}
        conflicts = 0
        read_afresh = False
        deadline_s = self.settings.operation_deadline_s
        # One deadline for the whole call: the wait behind other writers of the key (stuck in
        # an outage, each would otherwise hand the next a full deadline of its own), every
        # attempt, every wait for a connection, every statement and the read-back of an
        # unknown commit.
        with operation_deadline(deadline_s), self._locked_within(lock_key, deadline_s):
            unreachable = _Deadline("save", deadline_s).pause
            while True:
                self.app.ensure_open("save")  # checked on every attempt: a retry stops at close
                uow = UnitOfWork(
                    command,
                    now or self.clock(),
                    self,
                    assume_new=assume_new,
                    actor=current_actor.get(),
                    fresh=read_afresh,
                )
                try:
                    # With the caller's key, the domain answers a repeat from the log itself.
                    result, events, first = self._decide(uow, decide, unknown if command_id is None else {})
                except _AlreadyCommitted as done:
                    return unknown[done.at]
                except UNREACHABLE as error:
                    unreachable(error, outcome_unknown=bool(unknown))
                    continue
                except _StaleRefusal as stale:
                    conflicts += 1
                    if conflicts > budget:
                        raise stale.refusal from None
                    read_afresh = True
                    continue
                except STATE_REFUSALS as refusal:
                    # Once, reading every aggregate from the store (a command may touch several
                    # cached copies, or read several at different moments); never for an error
                    # that saved events (Expired).
                    maybe_stale = uow.from_cache or len(uow.touched) > 1
                    if not maybe_stale or isinstance(refusal, KEEPS_EVENTS):
                        raise
                    if read_afresh:
                        # Read afresh, one after the other, and raced again: another writer
                        # moved one of them on between the reads (a sweep read a task held by
                        # a-1, then a-1 after the task went to a-2: "does not hold"). Such a
                        # refusal is a lost race, retried as one; a refusal the log still
                        # confirms reaches the caller.
                        if len(uow.touched) < 2 or not self._moved_on(uow):
                            raise
                        conflicts += 1
                        if conflicts > budget:
                            raise
                        continue
                    read_afresh = True
                    continue
                if not events:
                    if uow.from_cache and not read_afresh:
                        # Nothing to save, decided on cached copies: no version check will
                        # catch a copy another engine has changed since (an assign on a stale
                        # "escalated" copy answered 200 and did nothing), so decide once more
                        # on state read from the log, as for a refusal.
                        read_afresh = True
                        continue
                    self._keep(uow)
                    return result
                try:
                    self._save(uow, events)
                except IntegrityError:
                    self._forget(uow)
                    if self._committed(first, command):
                        if command_id is None:
                            # Our own id: only an earlier attempt of this call, whose outcome was
                            # lost and which committed after this attempt looked for it, wrote
                            # it at this version. Its result is what is stored (this attempt's
                            # answered a start's expiry a second later than the one stored).
                            return unknown.get(first, result)
                        # The caller's key: this call or an earlier one with the same key
                        # wrote it. Decide again on fresh state, which answers from the log.
                        continue
                    if assume_new:  # it existed after all: read it, no need to back off
                        assume_new = False
                        continue
                    conflicts += 1
                    with self._conflicts_lock:
                        self.conflicts += 1
                    if conflicts > budget:
                        bound = self.settings.max_conflict_retries
                        raise ConcurrentUpdate(lock_key, conflicts, bound) from None
                    time.sleep(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**conflicts)))
                    continue
                except AppendNotSent as error:
                    # Never sent (no connection could be taken): nothing was stored by it.
                    self._forget(uow)
                    unreachable(error, outcome_unknown=bool(unknown))
                    continue
                except UNREACHABLE as error:
                    # The append may or may not have committed: remember this attempt's
                    # result; the next attempt looks for the command id before deciding.
                    self._forget(uow)
                    unknown[first] = result
                    unreachable(error, outcome_unknown=True)
                    continue
                except PRIVILEGE_ERRORS as error:
                    self._forget(uow)
                    if refused_privilege(error):  # a read-only role, say: waiting will not mend it
                        raise forbidden("save", error) from error
                    raise
                # Back in the cache only last: from then on another command may take and
                # change the objects, and the snapshots and listeners must see them as saved.
                self._snapshot(uow, events)
                for listener in self.saved_listeners:
                    for aggregate in uow.touched.values():
                        listener(aggregate)
                self._keep(uow)
                return result

    def _locked_within(self, lock_key: str, deadline_s: float) -> _LockedWithin:
        """Hold ``lock_key``'s in-process lock, waiting at most what is left of the operation."""
        return _LockedWithin(self._locks(lock_key, timeout=remaining_s(deadline_s)), lock_key)

    def _decide(
        self, uow: UnitOfWork, decide: Callable[[UnitOfWork], T], unknown: dict[tuple[UUID, int], T]
    ) -> tuple[T, list[Any], tuple[UUID, int]]:
        try:
            for at in unknown:
                if self._committed(at, uow.command_id):
                    raise _AlreadyCommitted(at)
            try:
                result = decide(uow)
            except KEEPS_EVENTS as refusal:
                events = self._collect(uow)
                if events:
                    try:
                        self._save(uow, events)
                    except IntegrityError:
                        # The stream moved on since the copy decided on was read (another
                        # engine extended or closed the session): decide again on the log.
                        raise _StaleRefusal(refusal) from None
                    except UNREACHABLE:
                        pass  # best effort: the next command records the same fact
                raise
        except BaseException:
            self._forget(uow)
            raise
        finally:
            uow.close()
        events = self._collect(uow)
        first = (events[0].originator_id, events[0].originator_version) if events else (UUID(int=0), 0)
        return result, events, first

    @staticmethod
    def _collect(uow: UnitOfWork) -> list[Any]:
        return [event for aggregate in uow.touched.values() for event in aggregate.collect_events()]

    def _save(self, uow: UnitOfWork, events: list[Any]) -> None:
        # The mapper and recorder directly: the library's ``EventStore.put`` also builds a
        # ``Recording`` and a ``Notification`` per event, which nothing here reads.
        store = self.app.events
        stored = [store.mapper.to_stored_event(event) for event in events]
        if uow.transaction is None:
            store.recorder.insert_events(stored)
        else:
            store.recorder.insert_events(stored, transaction=uow.transaction)

    def _committed(self, at: tuple[UUID, int], command_id: str) -> bool:
        """Whether the stream holds an event of ``command_id`` at or after version ``at[1]``,
        read within what is left of the operation (StoreUnavailable, outcome unknown, past it)."""
        aggregate_id, version = at
        if version == 0:
            return False
        operation = "read back an unknown commit"
        deadline = _Deadline(operation, self.settings.operation_deadline_s)
        if deadline.at <= time.monotonic():
            raise StoreUnavailable(operation, "the operation's deadline passed", outcome_unknown=True)
        while True:
            self.app.ensure_open(operation)
            try:
                stored = self.app.events.get(aggregate_id, gt=version - 1)
                return any(command_id_of(event) == command_id for event in stored)
            except UNREACHABLE as error:
                deadline.pause(error, outcome_unknown=True)

    def _moved_on(self, uow: UnitOfWork) -> bool:
        """Whether the log holds an event past the version this attempt read of any aggregate."""
        recorder = self.app.recorder

        def check() -> bool:
            return any(
                recorder.select_events(aggregate_id, gt=version, limit=1)
                for aggregate_id, version in uow.read_versions.items()
            )

        return self._read("check what a refusal was decided on", check)

    def _keep(self, uow: UnitOfWork) -> None:
        for aggregate_id, aggregate in uow.touched.items():
            self._cache.put(aggregate_id, aggregate)

    def _forget(self, uow: UnitOfWork) -> None:
        # Stale (another writer first) or half-applied: load afresh next time.
        for aggregate_id in uow.touched:
            self._cache.evict(aggregate_id)

    def _snapshot(self, uow: UnitOfWork, events: list[Any]) -> None:
        """Snapshot each aggregate whose saved events crossed a multiple of the interval."""
        snapshots = self.app.snapshots
        if snapshots is None:
            return
        interval = self.settings.snapshot_interval
        if len(uow.touched) == 1:  # the common case, without building the map below
            (aggregate,) = uow.touched.values()
            if aggregate.version // interval > (events[0].originator_version - 1) // interval:
                with suppress(*UNREACHABLE):
                    snapshots.put([type(aggregate).Snapshot.take(aggregate)])
            return
        first: dict[UUID, int] = {}
        for event in events:
            first.setdefault(event.originator_id, event.originator_version)
        taken = [
            type(aggregate).Snapshot.take(aggregate)
            for aggregate_id, aggregate in uow.touched.items()
            if aggregate.version // interval
            > (first.get(aggregate_id, aggregate.version + 1) - 1) // interval
        ]
        if taken:
            # A snapshot only saves reading time: if this fails, the next crossing takes one.
            with suppress(*UNREACHABLE):
                snapshots.put(taken)


class _Deadline:
    """When an operation must have succeeded by; ``pause(error)`` waits before another try or gives up."""

    __slots__ = ("at", "operation")

    def __init__(self, operation: str, seconds: float) -> None:
        self.operation = operation
        self.at = time.monotonic() + remaining_s(seconds)  # within the enclosing operation's

    def pause(self, error: Exception, *, outcome_unknown: bool = False) -> None:
        """Sleep before the next attempt, or raise StoreUnavailable when that would pass the
        deadline (``outcome_unknown``: a save was sent whose outcome is not known)."""
        pause = jittered(_UNREACHABLE_PAUSE_S)
        if time.monotonic() + pause >= self.at:
            # The server's first line, as every other StoreUnavailable: the rest is its CONTEXT
            # (the append's SQL and internal function), which reached HTTP bodies and the CLI.
            text = str(error).strip()
            detail = text.splitlines()[0] if text else type(error).__name__
            raise StoreUnavailable(self.operation, detail, outcome_unknown=outcome_unknown) from error
        time.sleep(pause)


class _LockedWithin:
    """A key's lock held for a ``write``; past the operation's deadline, StoreUnavailable.

    A class, not a generator-based context manager: every write enters one, and the
    generator's machinery (its frame, the StopIteration that ends it) cost about 2 µs more per
    write (``timeit``)."""

    __slots__ = ("_hold", "_key")

    def __init__(self, hold: AbstractContextManager[None], lock_key: str) -> None:
        self._hold = hold
        self._key = lock_key

    def __enter__(self) -> None:
        try:
            self._hold.__enter__()
        except LockWaitTimeout:
            detail = f"other writers of {self._key!r} held it past the operation's deadline"
            raise StoreUnavailable("save", detail) from None

    def __exit__(self, *_: object) -> None:
        self._hold.__exit__(None, None, None)


class _StaleRefusal(Exception):
    """A refusal that keeps events (``KEEPS_EVENTS``) whose events clashed with the stream:
    it was decided on state the log has moved past."""

    def __init__(self, refusal: Exception) -> None:
        super().__init__(refusal)
        self.refusal = refusal


class _AlreadyCommitted(Exception):
    """An earlier attempt with an unknown outcome did commit (its key: first aggregate, version)."""

    def __init__(self, at: tuple[UUID, int]) -> None:
        super().__init__(at)
        self.at = at
