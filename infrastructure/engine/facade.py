"""The Engine: flowledger's application service. Methods take and return plain values.

Each command loads an aggregate, calls one of its methods and saves it. A save that
loses an optimistic-concurrency race is retried against fresh state (bounded), then
surfaces as ConcurrentUpdate. Writers in one process are also serialised per
aggregate by a lock per aggregate, so retries are only needed across processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import IntegrityError
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from flowledger.domain.errors import (
    ConcurrentUpdate,
    SessionExpired,
    SessionNotFound,
    ValidationError,
)
from flowledger.domain.ports import LlmPort
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.session_views import SessionState, StepRecord
from flowledger.domain.values import JsonObject, LlmUsage, require_ttl
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.keyed_locks import KeyedLocks
from flowledger.infrastructure.engine.sessions import SessionCommands
from flowledger.infrastructure.engine.steps import StepProcessing
from flowledger.infrastructure.engine.tasks import TaskCommands
from flowledger.infrastructure.engine.write_cache import WriteCache
from flowledger.infrastructure.history import HistoryEntry, history_entry
from flowledger.infrastructure.postgres.database import ensure_schema, library_env
from flowledger.infrastructure.postgres.embedded import embedded_database_url
from flowledger.infrastructure.settings import MEMORY_URL, Settings

T = TypeVar("T")
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)


class Engine(SessionCommands, StepProcessing, TaskCommands):
    """Sessions and their steps, stored as events in PostgreSQL (or in memory)."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        tenant: str | None = None,
        schema: str | None = None,
        clock: Clock = utc_now,
        llm: LlmPort | None = None,
    ) -> None:
        if clock().tzinfo is None:
            raise ValidationError("clock", "must return timezone-aware datetimes")
        base = settings if settings is not None else Settings.from_env()
        self.settings = base.with_overrides(database_url=database_url, tenant=tenant, schema=schema)
        url = self.settings.database_url or embedded_database_url(self.settings.home)
        ensure_schema(url, self.settings.schema)
        self.database_url = url
        self.tenant = self.settings.tenant
        self.clock = clock
        self.llm = llm
        env = library_env(url, schema=self.settings.schema, pool_size=self.settings.pool_size)
        self.app = FlowledgerApplication(env, snapshot_interval=self.settings.snapshot_interval)
        self._locks = KeyedLocks()
        self._writers: WriteCache[Session] = WriteCache(self.settings.write_cache_size)

    @classmethod
    def in_memory(cls, **kwargs: Any) -> Engine:
        """An engine whose events live in this process only (fast unit tests)."""
        return cls(database_url=MEMORY_URL, **kwargs)

    def close(self) -> None:
        """Release database connections."""
        self.app.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------

    def session_uuid(self, session_id: str) -> UUID:
        """The aggregate id of a caller's session id in this engine's tenant."""
        return session_uuid(self.tenant, session_id)

    def get_session(
        self, session_id: str, version: int | None = None, as_of: datetime | None = None
    ) -> SessionState:
        """The session now, at a version, or as it was at a moment (not both)."""
        if version is not None and as_of is not None:
            raise ValidationError("version", "give version or as_of, not both")
        if as_of is not None:
            if as_of.tzinfo is None:
                raise ValidationError("as_of", "must be timezone-aware")
            versions = [e.version for e in self.history(session_id) if e.timestamp <= as_of]
            if not versions:
                raise SessionNotFound(session_id)
            version = versions[-1]
        if version is not None and version < 1:
            raise ValidationError("version", f"must be >= 1, got {version}")
        session = self._load(session_id, version)
        if version is not None and session.version < version:
            raise ValidationError("version", f"session has {session.version} versions, not {version}")
        return session.state()

    def history(self, session_id: str) -> list[HistoryEntry]:
        """The session's events, oldest first."""
        events = list(self.app.events.get(self.session_uuid(session_id)))
        if not events:
            raise SessionNotFound(session_id)
        return [history_entry(e) for e in events]

    # -- commands ----------------------------------------------------------------------

    def start_session(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None = None,
        ttl: timedelta = timedelta(hours=24),
        metadata: JsonObject | None = None,
    ) -> SessionState:
        """Start a session; starting it again with the same workflow and user is a no-op."""
        require_ttl(ttl)
        with self._lock(session_id):
            return self._retrying(
                session_id,
                lambda: self._start(session_id, workflow, user_id, ttl, {} if metadata is None else metadata),
            )

    def record_step(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        output: JsonObject | None = None,
        next_step: str | None = None,
        context_update: JsonObject | None = None,
        usage: LlmUsage | None = None,
        idempotency_key: str | None = None,
    ) -> StepRecord:
        """Record a step whose model call happened elsewhere; a known key returns its record."""

        def record(session: Session) -> StepRecord:
            recorded = session.recorded_outcome(idempotency_key)
            if recorded is not None:
                return recorded
            session.ensure_open(self.clock())
            return session.record_step(
                step=step,
                input=input if input is not None else {},
                output=output if output is not None else {},
                next_step=next_step,
                context_update=context_update,
                usage=usage,
                idempotency_key=idempotency_key,
            )

        return self.update(session_id, record)

    # -- mechanics ---------------------------------------------------------------------

    def update(self, session_id: str, command: Callable[[Session], T]) -> T:
        """Load the session, run ``command`` on it, save; retried on concurrent writes."""
        with self._lock(session_id):
            return self._retrying(session_id, lambda: self._apply(session_id, command))

    def _apply(self, session_id: str, command: Callable[[Session], T]) -> T:
        key = self.session_uuid(session_id)
        session = self._writers.get(key) or self._load(session_id)
        try:
            result = command(session)
        except SessionExpired:
            # ensure_open recorded Expired before raising: keep that event.
            self._save_and_cache(key, session)
            raise
        except BaseException:
            self._writers.evict(key)
            raise
        self._save_and_cache(key, session)
        return result

    def _save_and_cache(self, key: UUID, session: Session) -> None:
        try:
            self._save(session)
        except BaseException:
            # Stale (another process wrote first) or half-applied: reload next time.
            self._writers.evict(key)
            raise
        self._writers.put(key, session)

    def _start(
        self, session_id: str, workflow: str, user_id: str | None, ttl: timedelta, metadata: JsonObject
    ) -> SessionState:
        key = self.session_uuid(session_id)
        if self._writers.get(key) is None:
            # Optimistic: most starts are new sessions, so write first and compare only
            # when version 1 turns out to exist already.
            session = Session.start(
                session_id=session_id,
                tenant=self.tenant,
                workflow=workflow,
                user_id=user_id,
                expires_at=self.clock() + ttl,
                metadata=metadata,
            )
            try:
                self._save(session)
            except IntegrityError:
                pass
            else:
                self._writers.put(key, session)
                return session.state()
        existing = self._load(session_id)
        existing.ensure_same_start(workflow=workflow, user_id=user_id)
        return existing.state()

    def _load(self, session_id: str, version: int | None = None) -> Session:
        try:
            session: Session = self.app.repository.get(self.session_uuid(session_id), version=version)
        except AggregateNotFoundError:
            raise SessionNotFound(session_id) from None
        return session

    def _save(self, session: Session) -> None:
        # The library's app.save() adds generic bookkeeping (and protocol isinstance
        # checks) that cost a third of a step; a session needs only this.
        events = session.collect_events()
        if not events:
            return
        self.app.events.put(events)
        interval = self.settings.snapshot_interval
        crossed = events[-1].originator_version // interval > (events[0].originator_version - 1) // interval
        if crossed and self.app.snapshots is not None:
            self.app.snapshots.put([Session.Snapshot.take(session)])

    def _retrying(self, session_id: str, attempt: Callable[[], T]) -> T:
        try:
            return attempt()  # the common case needs no retry machinery
        except IntegrityError:
            retries = self.settings.max_conflict_retries
        if retries == 0:
            raise ConcurrentUpdate(session_id, 1) from None
        retrying = Retrying(
            retry=retry_if_exception_type(IntegrityError),
            stop=stop_after_attempt(retries),
            wait=wait_random_exponential(multiplier=0.002, max=0.05),
        )
        try:
            return retrying(attempt)
        except RetryError:
            raise ConcurrentUpdate(session_id, retries + 1) from None

    def _lock(self, key: str) -> threading.Lock:
        return self._locks(key)
