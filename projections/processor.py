"""The batch processor: reads notifications in batches, decodes them once, lets each projection
write its rows, and moves each projection's tracking position in the same transaction.

Exactly once, no gaps: a batch's rows and positions commit together or not at all; the
tracking rows are locked (FOR UPDATE) for the batch, and every projection skips events at
or below its stored position, so concurrent followers or a restart never count twice.

Never wedged: an event a projection cannot apply is set aside as a dead letter of that
build (``dead_letters``) inside the same transaction, and the position moves past it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from time import monotonic
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import ApplicationRecorder, Mapper, Notification
from psycopg import Connection, Cursor

from flowledger.domain.errors import (
    StoredEventAltered,
    StoredEventUnreadable,
    StoreUnavailable,
    ValidationError,
)
from flowledger.infrastructure import outages
from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.postgres.database import as_snapshot_reader
from flowledger.infrastructure.postgres.recorder import ReadTopics
from flowledger.infrastructure.postgres.watchdog import watching
from flowledger.projections import dead_letters
from flowledger.projections.archived import ChainKey
from flowledger.projections.base import Envelope, Projection, known_topics
from flowledger.projections.calls import call_of
from flowledger.projections.catalog import Names, active_schemas, install
from flowledger.projections.continuity import StreamChecks
from flowledger.projections.sql import q

Progress = Callable[[int], None]
"""Called after each batch with the last notification id applied."""
BatchHook = Callable[[int], None]
"""Called inside each batch's transaction, after its rows are written and before it commits."""


@dataclass(frozen=True)
class Target:
    """A projection and the build schema its rows go to."""

    projection: Projection
    schema: str


Resolve = Callable[[Cursor[Any]], list[Target]]
"""Works out the targets of a batch inside its transaction (live builds are locked FOR SHARE)."""


class Projector:
    """Runs projections over one event store's log."""

    def __init__(
        self,
        *,
        database_url: str,
        store_schema: str,
        recorder: ApplicationRecorder,
        mapper: Mapper[UUID],
        projections: Sequence[Projection],
        batch_size: int = 2000,
        read_url: str | None = None,
        pgbouncer: bool = False,
        deadline_s: float = 15.0,
        connect_timeout_s: float | None = None,
        chain_key: ChainKey | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValidationError("batch_size", f"must be >= 1, got {batch_size}")
        self.database_url = database_url
        self.read_url = read_url
        """A streaming replica the read models are read from (None: ``database_url``)."""
        # Behind PgBouncer in transaction mode a prepared statement lives in one backend and the
        # next transaction may run on another ("_pg3_0" already exists / does not exist).
        self._connect_kwargs: dict[str, Any] = {"prepare_threshold": None} if pgbouncer else {}
        if connect_timeout_s is not None:  # libpq counts whole seconds, and reads 1 as 2
            self._connect_kwargs["connect_timeout"] = max(2, math.ceil(connect_timeout_s))
        self.deadline_s = deadline_s
        """How long connecting, or a read of the log, is tried before StoreUnavailable (the engine's
        operation deadline)."""
        self.names = Names(store_schema)
        self.recorder = recorder
        self.events_table: str = getattr(recorder, "events_table_name", "stored_events")
        """The log's table in ``store_schema`` (checked for deleted rows batch by batch)."""
        self.continuity = StreamChecks(self.names.store, self.events_table)
        """Checks each batch's range of the log for a row deleted or moved (``continuity``)."""
        self.mapper = mapper
        self.known = sorted(known_topics())
        """The topics of this release's event classes: a batch reads the rows of any other topic
        too (``read``), to name them rather than pass over them (``strangers``)."""
        self.projections = list(projections)
        self.orphans = frozenset(self.known) - frozenset().union(*(p.topics for p in self.projections))
        """Known topics no projection reads (the budgets' events): read by every batch too, so
        that the hash check sees a row moved to one of them; few rows, so little to read."""
        self.batch_size = batch_size
        self.chain_key = chain_key
        """Gives the chain key archived sessions' bases are checked under before a new build
        takes their rows (``archived.py``); None: a build over a store with bases is refused."""

    def connect(self) -> Connection[Any]:
        """A new autocommit connection; transactions are opened explicitly."""
        return within_deadline(
            "connect to the read models",
            self.deadline_s,
            lambda: psycopg.connect(self.database_url, autocommit=True, **self._connect_kwargs),
        )

    def connect_reader(self, *, primary: bool = False) -> Connection[Any]:
        """A new connection to read the read models on: the replica when there is one (it holds
        what it has replayed), else (or with ``primary``) the database the projections are
        written to.

        Its queries share one read-only ``REPEATABLE READ`` transaction (ended when the
        ``with`` block closes the connection), so a report built from several queries sees one
        moment: with a query each in autocommit, a batch the projections committed between two
        of them made the answers disagree and the funnel raise."""
        url = self.database_url if primary else (self.read_url or self.database_url)
        return as_snapshot_reader(
            within_deadline(
                "connect to the read models",
                self.deadline_s,
                lambda: psycopg.connect(url, **self._connect_kwargs),
            )
        )

    @contextmanager
    def report(self, *, primary: bool = False) -> Iterator[Connection[Any]]:
        """A ``connect_reader`` connection for one report (a dashboard, a funnel), closed after
        it: the report is one operation of ``deadline_s``, and a query still running when it ends
        is ended by the statement watchdog (``StoreUnavailable`` at the edges). These connections
        are the projector's own, not a pool's: a path that stopped relaying mid-report held a
        dashboard request with a 3 s deadline until it relayed again (an outside probe: 30 s)."""
        with (
            operation_deadline(self.deadline_s),
            self.connect_reader(primary=primary) as conn,
            watching(conn),
        ):
            yield conn

    @contextmanager
    def briefly(self) -> Iterator[Connection[Any]]:
        """A ``connect`` connection for one short use (``status``, the dead letters' listings),
        closed after it: one operation of ``deadline_s``, a statement still running when it
        ends ended by the statement watchdog (a path that stopped relaying held `projections
        status` until it relayed again)."""
        with operation_deadline(self.deadline_s), self.connect() as conn, watching(conn):
            yield conn

    @contextmanager
    def watched(self, conn: Connection[Any], what: str) -> Iterator[None]:
        """Run the block as one operation of ``deadline_s`` on ``conn`` (one of the projector's
        own connections, which no pool arms): a statement still running when it passes is ended
        by the statement watchdog, and ``conn`` closed; the error is then ``StoreUnavailable``
        naming ``what`` and the deadline. Unwatched, a follower's batch on a path that stopped
        relaying said nothing for 29 s with a 2 s deadline, until the path gave up."""
        with operation_deadline(self.deadline_s) as end:
            try:
                with watching(conn):
                    yield
            except outages.CONNECTION_ERRORS as error:
                if monotonic() < end:
                    raise  # not the deadline: a lost connection, or a stop request's cancel
                detail = outages.unavailable(what, error).detail
                raise StoreUnavailable(
                    what, f"no answer within the {self.deadline_s:g} s operation deadline ({detail})"
                ) from error

    @contextmanager
    def _piece(self, conn: Connection[Any], bounded: bool, what: str = "catch up") -> Iterator[None]:
        """One piece of a catch-up (installing the builds, a batch): with ``bounded``, an
        operation of ``deadline_s`` whose statements on ``conn`` the watchdog ends (``watched``)."""
        if not bounded:
            yield
            return
        with self.watched(conn, what):
            yield

    def head(self) -> int:
        """The highest notification id readable now (0 for an empty log)."""
        return within_deadline(
            "read the log", self.deadline_s, lambda: self.recorder.max_notification_id() or 0
        )

    def read_topics(self, topics: Iterable[str]) -> ReadTopics:
        """What a batch reads for projections of ``topics``: those, the ``orphans``, and the
        rows of unknown topics (``ReadTopics``), which ``strangers`` names or passes over."""
        return ReadTopics(sorted(set(topics) | self.orphans), self.known)

    def read(
        self, start: int, stop: int, topics: Sequence[str], limit: int | None = None
    ) -> list[Notification]:
        """Up to ``limit`` (the batch size) notifications of ``topics`` from ``start`` through
        ``stop`` (and of ``read_topics``'s others)."""
        size = self.batch_size if limit is None else limit
        return within_deadline(
            "read the log",
            self.deadline_s,
            lambda: list(
                self.recorder.select_notifications(
                    start=start, limit=size, stop=stop, topics=self.read_topics(topics)
                )
            ),
        )

    def ready_to_read(self) -> Projector:
        """This projector, once its read models may be read: caught up to the head of the log
        here; with a replica, as they stand there (a follower keeps them current, so a read
        never writes to the primary)."""
        if self.read_url is None:
            self.catch_up(bounded=True)
        return self

    def select(self, wanted: Sequence[str] | None) -> list[Projection]:
        """The projections named in ``wanted`` (all when None); unknown names raise ValidationError."""
        if not wanted:
            return list(self.projections)
        by_name = {p.name: p for p in self.projections}
        missing = [name for name in wanted if name not in by_name]
        if missing:
            raise ValidationError("projection", f"unknown projection(s) {missing}; known: {sorted(by_name)}")
        return [by_name[name] for name in wanted]

    def live(self, projections: Sequence[Projection]) -> Resolve:
        """Targets that follow whichever build is live when each batch runs."""
        by_name = {p.name: p for p in projections}

        def resolve(cur: Cursor[Any]) -> list[Target]:
            schemas = active_schemas(cur, self.names, list(by_name), lock=True)
            return [Target(by_name[name], schema) for name, schema in schemas.items()]

        return resolve

    def catch_up(
        self,
        wanted: Sequence[str] | None = None,
        *,
        progress: Progress | None = None,
        on_batch: BatchHook | None = None,
        max_batches: int | None = None,
        bounded: bool = False,
    ) -> int:
        """Bring the live builds up to the head of the log; return how many notifications were read.

        ``bounded`` (a read catching up first, ``ready_to_read``): installing the builds and each
        batch is one operation of ``deadline_s``, so a path that stops relaying or a server that
        stops answering ends it with an error then (a dashboard request with a 3 s deadline hung
        in ``install`` until the path relayed again, 30 s in an outside probe); a long backlog
        still catches up, a batch at a time."""
        projections = self.select(wanted)
        with self.connect() as conn:
            with self._piece(conn, bounded, "install the read models"):
                install(conn, self.names, projections, key=self.chain_key)
            return self.drive(
                conn,
                self.live(projections),
                progress=progress,
                on_batch=on_batch,
                max_batches=max_batches,
                bounded=bounded,
            )

    def positions(self, cur: Cursor[Any], schemas: Sequence[str], *, lock: bool = False) -> dict[str, int]:
        """Tracking positions of builds (locked FOR UPDATE with ``lock``)."""
        statement = "SELECT schema_name, position FROM {s}.builds WHERE schema_name = ANY(%s)"
        statement += " ORDER BY schema_name FOR UPDATE" if lock else ""
        cur.execute(q(statement, self.names.control), [list(schemas)])
        return {row[0]: int(row[1]) for row in cur.fetchall()}

    def drive(
        self,
        conn: Connection[Any],
        resolve: Resolve,
        *,
        stop: int | None = None,
        progress: Progress | None = None,
        on_batch: BatchHook | None = None,
        max_batches: int | None = None,
        halt: Callable[[], bool] | None = None,
        bounded: bool = False,
    ) -> int:
        """Apply batches until the log (up to ``stop``) is exhausted, or ``halt`` says so before
        a batch (a follower asked to stop mid catch-up); return notifications read.

        ``stop`` defaults to the head of the log when the call begins, so a call ends under a
        steady load: it chased the head for as long as an event arrived during each batch (a
        dashboard read that caught up first answered only when the writers paused). A
        follower goes on from there with what it is sent.

        ``bounded``: each batch is one operation of ``deadline_s``, watched (``watched``): a
        follower and a rebuild drive so, and a read catching up first (``catch_up``).

        Only the topics the targets handle are read. The head of the log is taken before each
        read, so a read that comes back short has seen every handled event up to the head,
        and the positions move to the head even when its last events are of other topics.
        """
        read = batches = 0
        if stop is None:
            stop = self.head()
        while (max_batches is None or batches < max_batches) and not (halt is not None and halt()):
            with self._piece(conn, bounded, "project a batch of the log"):
                with conn.cursor() as cur:
                    targets = resolve(cur)
                    if not targets:
                        break
                    after = min(self.positions(cur, [t.schema for t in targets]).values(), default=0)
                head = min(self.head(), stop)
                if after >= head:
                    break
                topics = sorted(set().union(*(t.projection.topics for t in targets)))
                notifications = self.read(after + 1, head, topics)
                through = notifications[-1].id if len(notifications) >= self.batch_size else head
                if self.run_batch(
                    conn, resolve, notifications, after=after, through=through, on_batch=on_batch
                ):
                    read += len(notifications)
                    batches += 1
                    if progress is not None:
                        progress(through)
        return read

    def run_batch(
        self,
        conn: Connection[Any],
        resolve: Resolve,
        notifications: Sequence[Notification],
        *,
        after: int,
        through: int | None = None,
        on_batch: BatchHook | None = None,
    ) -> bool:
        """Apply ``notifications`` (every handled one after id ``after``, up to ``through``,
        default the last one's id) in one transaction, and move the positions to ``through``.

        An event a projection cannot apply becomes a dead letter of that build, and the
        rest of the batch is applied (see ``dead_letters``). A row deleted from the middle
        of a stream in the batch's range is ``StoredEventMissing``, and one moved before the
        version it follows ``StoredEventOutOfOrder``, with nothing written (``continuity``): a
        build must not count a session without its step, nor apply its steps out of order.
        Returns False, writing nothing, if some target's position is behind ``after`` (its
        build changed since the batch was read): the caller reads again.
        """
        last = through if through is not None else notifications[-1].id if notifications else after
        with conn.transaction(), conn.cursor() as cur:
            targets = resolve(cur)
            positions = self.positions(cur, [t.schema for t in targets], lock=True)
            if any(positions.get(t.schema, -1) < after for t in targets):
                return False
            self.continuity.check(cur, after=min(positions.values(), default=last), through=last)
            ids = [n.id for n in notifications]
            first = bisect_right(ids, min(positions.values(), default=0))
            altered, fitting = self.continuity.hashes(cur, notifications[first:])
            envelopes = [decoded(self.mapper, n, altered=n.id in altered) for n in notifications[first:]]
            unknown = strangers(envelopes, frozenset(self.known), altered, fitting)
            for target in targets:
                position = positions[target.schema]
                topics = target.projection.topics
                todo = [e for e in envelopes[bisect_right(ids, position) - first :] if e.topic in topics]
                undecodable = [(e, e.event.error) for e in todo if isinstance(e.event, _Undecodable)]
                if undecodable:
                    todo = [e for e in todo if not isinstance(e.event, _Undecodable)]
                refused = _apply_isolating(cur, target, todo)
                hidden = [(e, why) for e, why in unknown if e.id > position and e.topic not in topics]
                faults = undecodable + refused + hidden
                dead_letters.record(
                    cur,
                    self.names,
                    target.schema,
                    target.projection.name,
                    [
                        (
                            e.id,
                            e.topic,
                            _attribute(e, "originator_id"),
                            _attribute(e, "originator_version"),
                            why,
                        )
                        for e, why in sorted(faults, key=lambda fault: fault[0].id)
                    ],
                )
                if last > position:
                    cur.execute(
                        q(
                            "UPDATE {s}.builds SET position = %s, events = events + %s,"
                            " updated_at = now() WHERE schema_name = %s",
                            self.names.control,
                        ),
                        [last, len(todo) - len(refused), target.schema],
                    )
            if on_batch is not None:
                on_batch(last)
        return True


@dataclass(frozen=True)
class _Undecodable:
    """Stands in for an event that did not decode."""

    error: str
    originator_id: Any
    originator_version: int


def decoded(mapper: Mapper[UUID], notification: Notification, *, altered: bool = False) -> Envelope:
    """The notification's event, or a stand-in set aside as a dead letter: one that does not
    decode, or (``altered``) one whose content is not what its chained hash was taken over,
    which a build must not count (``continuity``)."""
    try:
        event = mapper.to_domain_event(notification)
        if altered:
            raise StoredEventAltered(str(notification.originator_id), notification.originator_version)
        return Envelope(notification.id, event, call_of(event), notification.topic)
    except Exception as error:  # any decoding failure is a dead letter, not a stop
        stand_in = _Undecodable(
            dead_letters.describe(error), notification.originator_id, notification.originator_version
        )
        return Envelope(notification.id, stand_in, None, notification.topic)


def strangers(
    envelopes: Sequence[Envelope], known: frozenset[str], altered: set[int], fitting: set[int]
) -> list[tuple[Envelope, str]]:
    """The events whose topic may not be the one they were written under, as dead letters of
    every build (each build adds those of topics it does not read; the others it sets aside
    itself): a topic edited in the database hid its event from every build that does not read
    the new one, and a rebuild dropped the step from the read models without a word.

    An event of a topic no class of this release has is named whatever its hash says when it
    does not fit (``StoredEventAltered``) or cannot be checked (``StoredEventUnreadable``); a
    newer release's event, its hash fitting, is passed over. An event of a known topic whose
    hash does not fit (``StoredEventAltered``) may have been moved to it from another.
    Cheap: the batch's read returns rows of unknown topics besides its own (a test on the topic
    of each row it reads past anyway), and the hashes are those the batch checks already; a
    topic moved to a known one no projection of the run reads is ``audit verify``'s to name.
    """
    letters = []
    for envelope in envelopes:
        stranger = envelope.topic not in known and envelope.id not in fitting
        if not stranger and envelope.id not in altered:
            continue
        stream = _attribute(envelope, "originator_id")
        version = _attribute(envelope, "originator_version")
        error: Exception = (
            StoredEventAltered(str(stream), version)
            if envelope.id in altered
            else StoredEventUnreadable(str(stream), version, envelope.topic, "no event class has this topic")
        )
        letters.append((envelope, dead_letters.describe(error)))
    return letters


def _attribute(envelope: Envelope, name: str) -> Any:
    return getattr(envelope.event, name, None)


def _apply_isolating(cur: Cursor[Any], target: Target, todo: list[Envelope]) -> list[tuple[Envelope, str]]:
    """Apply ``todo`` in a savepoint; if an event's fault stops it, halve the events until
    each failing one is alone, apply the others, and return the failing ones with their errors."""
    if not todo:
        return []
    try:
        with cur.connection.transaction():
            target.projection.apply(cur, target.schema, todo)
        return []
    except Exception as error:
        if not dead_letters.is_event_fault(error) or cur.connection.broken:
            raise
        if len(todo) == 1:
            return [(todo[0], dead_letters.describe(error))]
    middle = len(todo) // 2
    return _apply_isolating(cur, target, todo[:middle]) + _apply_isolating(cur, target, todo[middle:])
