"""The event log as readers see it: notifications in order, decoded events, streams.

Projections, audit, the CLI and tests read the log through ``engine.log`` instead of
reaching into the event library's application; this is the one place that knows how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import ApplicationRecorder, IntegrityError, Mapper, Notification, StoredEvent
from eventsourcing.utils import TopicError

from flowledger.domain.bounds import require_count, shown
from flowledger.domain.errors import StoredEventUnreadable, ValidationError
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.postgres.factory import FlowledgerSnapshotRecorder
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal

_READ = "read the log"
_BIGINT = 2**63 - 1
"""The largest notification id or version PostgreSQL stores (``bigint``)."""


class EventLog:
    """Read access to one engine's event log (and a raw append for tools and tests).

    Its reads are tried again within the engine's operation deadline, as the store's are, and
    end in ``StoreUnavailable`` past it; a bad argument is a ``ValidationError`` naming it.
    """

    def __init__(
        self,
        app: FlowledgerApplication,
        *,
        deadline_s: float = 15.0,
        ensure_open: Callable[[str], None] | None = None,
    ) -> None:
        self._app = app
        self._deadline_s = deadline_s
        self._ensure_open = app.ensure_open if ensure_open is None else ensure_open
        """EngineClosed once the engine reading through it is closed (its store's, by default)."""

    @property
    def recorder(self) -> ApplicationRecorder:
        """The recorder of the log (gap-safe reads in notification order)."""
        return self._app.recorder

    @property
    def mapper(self) -> Mapper[UUID]:
        """Turns stored events into domain events and back (with flowledger's transcodings)."""
        return self._app.mapper

    def head(self) -> int:
        """The highest notification id readable now (0 for an empty log)."""
        self._ensure_open(_READ)
        return within_deadline(_READ, self._deadline_s, lambda: self._app.recorder.max_notification_id() or 0)

    def read(self, after: int = 0, limit: int = 1000, topics: Sequence[str] = ()) -> list[Notification]:
        """Up to ``limit`` notifications after position ``after``, in order (only of ``topics``
        when given)."""
        require_count("after", after, most=_BIGINT)
        require_count("limit", limit, least=1, most=_BIGINT)
        wanted = _topics(topics)
        self._ensure_open(_READ)
        recorder = self._app.recorder
        return within_deadline(
            _READ,
            self._deadline_s,
            lambda: list(
                recorder.select_notifications(after, limit, topics=wanted, inclusive_of_start=False)
            ),
        )

    def notifications(self, after: int = 0, batch: int = 1000) -> Iterator[Notification]:
        """Every notification after ``after``, read in batches (the arguments checked at once)."""
        require_count("after", after, most=_BIGINT)
        require_count("batch", batch, least=1, most=_BIGINT)
        return self._pages(after, batch)

    def _pages(self, after: int, batch: int) -> Iterator[Notification]:
        while True:
            page = self.read(after, batch)
            if not page:
                return
            yield from page
            after = page[-1].id

    def decode(self, stored: StoredEvent | Notification) -> Any:
        """The domain event a stored event or notification holds."""
        if not isinstance(stored, StoredEvent):
            raise ValidationError(
                "stored", f"must be a stored event or a notification, got {type(stored).__name__}"
            )
        try:
            # A sealed event's data key may have to be read from the database.
            return within_deadline(_READ, self._deadline_s, lambda: self._app.mapper.to_domain_event(stored))
        except StoredEventUnreadable as error:
            if not isinstance(error.__cause__, TopicError):
                raise
            reason = error.__cause__
            raise ValidationError("stored", f"names no event class flowledger knows: {reason}") from None

    def encode(self, event: Any) -> StoredEvent:
        """The stored form of a domain event."""
        if not isinstance(getattr(event, "originator_id", None), UUID):
            raise ValidationError("event", f"must be a domain event, got {type(event).__name__}")
        return self._app.mapper.to_stored_event(event)

    def stream(self, aggregate_id: UUID, *, gt: int | None = None, lte: int | None = None) -> list[Any]:
        """One aggregate's domain events, oldest first (after version ``gt``, through ``lte``)."""
        stream = _stream_id(aggregate_id)
        for name, version in (("gt", gt), ("lte", lte)):
            if version is not None:
                require_count(name, version, most=_BIGINT)
        self._ensure_open(_READ)
        return within_deadline(
            _READ, self._deadline_s, lambda: list(self._app.events.get(stream, gt=gt, lte=lte))
        )

    def stored(self, aggregate_id: UUID) -> list[StoredEvent]:
        """One aggregate's stored events (topics and raw state), oldest first."""
        stream = _stream_id(aggregate_id)
        self._ensure_open(_READ)
        return within_deadline(
            _READ, self._deadline_s, lambda: list(self._app.recorder.select_events(stream))
        )

    def snapshots(
        self,
        aggregate_id: UUID,
        *,
        unreadable: list[StoredEventUnreadable] | None = None,
        seal: SnapshotSeal | None = None,
    ) -> list[Any]:
        """One aggregate's snapshots, oldest first (empty when snapshotting is off).

        A snapshot that does not read back (its seal does not check: ``snapshot_seal.py``)
        raises ``StoredEventUnreadable``; with ``unreadable`` given, it is added there instead
        and the others are returned, their seals checked under ``seal`` when given (``audit
        verify``, whose engine appends nothing and so holds no seal of its own)."""
        stream = _stream_id(aggregate_id)
        self._ensure_open(_READ)
        store = self._app.snapshots
        if store is None:
            return []
        recorder = store.recorder
        if unreadable is None or not isinstance(recorder, FlowledgerSnapshotRecorder):
            return within_deadline(_READ, self._deadline_s, lambda: list(store.get(stream)))

        def read() -> list[Any]:
            readable, bad = recorder.select_checked(stream, seal)
            unreadable.extend(bad)
            return [store.mapper.to_domain_event(s) for s in readable]

        return within_deadline(_READ, self._deadline_s, read)

    def snapshotted_streams(self) -> list[UUID]:
        """Every aggregate id that has a snapshot (none when snapshotting is off)."""
        self._ensure_open(_READ)
        store = self._app.snapshots
        if store is None:
            return []
        recorder = store.recorder
        streams = getattr(recorder, "streams", None)
        if callable(streams):  # PostgreSQL
            return within_deadline(_READ, self._deadline_s, streams)
        index: dict[str, Any] = getattr(recorder, "_stored_events_index", {})  # in memory
        return sorted(UUID(stream) for stream, versions in index.items() if versions)

    def append(self, events: Sequence[Any]) -> list[int]:
        """Append domain events as they are (tools and tests; commands go through the Engine)."""
        return self.append_stored([self.encode(event) for event in _listed("events", events)])

    def append_stored(self, stored: Sequence[StoredEvent]) -> list[int]:
        """Append already-encoded events (tests that store what a command never would).

        Not tried again: an append whose reply was lost may have been stored. A version the
        stream already has is a ``ValidationError``, and nothing of the batch is stored."""
        rows = _listed("stored", stored)
        for row in rows:
            if not isinstance(row, StoredEvent):
                raise ValidationError("stored", f"must hold stored events, got {type(row).__name__}")
        self._ensure_open("append to the log")
        try:
            return list(self._app.recorder.insert_events(rows) or [])
        except IntegrityError:
            versions = ", ".join(f"{row.originator_id} v{row.originator_version}" for row in rows[:5])
            raise ValidationError(
                "stored", f"a version of these is already stored (or archived): {versions}"
            ) from None


def _listed(name: str, value: Any) -> list[Any]:
    """The items of a list, tuple or other collection (one string, bytes or event alone is refused)."""
    if isinstance(value, str | bytes | StoredEvent) or not isinstance(value, Iterable):
        raise ValidationError(name, f"must be a list, got {type(value).__name__}")
    return list(value)


def _stream_id(value: Any) -> UUID:
    """An aggregate id: a UUID, or its text (``engine.session_uuid(id)`` gives a session's)."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise ValidationError(
        "aggregate_id", f"must be a UUID (engine.session_uuid(id) gives a session's), got {shown(value)}"
    )


def _topics(value: Any) -> list[str]:
    """Topics to read: strings, in a list or another collection (one string alone is refused)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValidationError("topics", f"must be a list of topic strings, got {shown(value)}")
    topics = list(value)
    if not all(isinstance(topic, str) for topic in topics):
        raise ValidationError("topics", f"must be a list of topic strings, got {shown(topics)}")
    return topics
