"""The event library's PostgreSQL factory, with flowledger's recorders and deadlines.

``library_env`` selects it by topic (``PERSISTENCE_MODULE``). The application and
process recorders append through ``FlowledgerApplicationRecorder`` (see its module for
the mechanism); snapshots keep the library's table and SQL. Every recorder reads
within the operation deadline, appends without retrying, and uses a pool that keeps
the deadlines and reconnects promptly (``deadlines.py``). No recorder creates tables:
``migrate`` does, once per database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import monotonic, sleep
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    OperationalError,
    ProcessRecorder,
    StoredEvent,
    Tracking,
)
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresProcessRecorder,
)
from eventsourcing.utils import Environment, EnvType
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier
from psycopg.types.composite import CompositeInfo, register_composite

from flowledger.domain.errors import StoredEventUnreadable, StoreRefused, StoreUnavailable
from flowledger.infrastructure.operation_deadline import operation_end
from flowledger.infrastructure.postgres.database import PGBOUNCER_HINT, STARTUP_OPTIONS_REFUSED
from flowledger.infrastructure.postgres.deadlines import (
    LIBPQ_PARAMS_KEY,
    Deadlines,
    ReconnectingPool,
    call_within_deadline,
    install_pool,
)
from flowledger.infrastructure.postgres.notify import Notifier, connect_like
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder, stored_events
from flowledger.infrastructure.postgres.recorder_errors import close_unfinished
from flowledger.infrastructure.postgres.retention import RetentionTables
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal, is_sealed, stripped
from flowledger.infrastructure.postgres.stream_reads import event_reads, read_stream, snapshot_reads

R = TypeVar("R")
_START_PAUSE_S = 0.2
"""Between tries of a recorder's construction (``FlowledgerPostgresFactory._made``)."""


class FlowledgerDatastore(PostgresDatastore):
    """The library's datastore, looking its row types up under the schema's quoted name."""

    def register_type_adapters(self) -> None:
        """The library's, with ``schema.type`` quoted: it wrote the name bare, so a schema named
        by a reserved word (``order``, ``user``), which ``migrate`` makes, failed every engine's
        start with "syntax error at or near "order"" (a bug in flowledger, exit 70)."""
        missing = [name for name in self.db_type_names if name not in self.psycopg_type_adapters]
        if not missing:
            return
        with self.get_connection() as conn:
            for name in missing:
                info = CompositeInfo.fetch(conn, Identifier(self.schema, name))
                if info is None:
                    continue
                register_composite(info, conn)
                self.psycopg_type_adapters[name] = info
                self.psycopg_python_types[name] = info.python_type


class FlowledgerSnapshotRecorder(PostgresAggregateRecorder):
    """The library's snapshot recorder: reads within the operation deadline, writes without
    retry; with ``seal`` set (the engine sets it when it chains its events), every snapshot is
    sealed as it is stored and checked as it is read (``snapshot_seal.py``)."""

    deadlines = Deadlines()
    seal: SnapshotSeal | None = None

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Store snapshots; a failure raises at once (the caller decides about retrying)."""
        if self.seal is not None:
            stored_events = [self.seal.sealed(e) for e in stored_events]
        insert = PostgresAggregateRecorder.insert_events.__wrapped__  # type: ignore[attr-defined]
        return insert(self, stored_events, **kwargs)  # type: ignore[no-any-return]

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The library's read, retried within the operation deadline (not 10 times)."""
        return call_within_deadline(
            lambda: self._select(originator_id, gt, lte, desc, limit),
            budget_s=self.deadlines.operation_s,
            pool=self.datastore.pool,
        )

    def _select(
        self, originator_id: UUID | str, gt: int | None, lte: int | None, desc: bool, limit: int | None
    ) -> list[StoredEvent]:
        # The library's statement, not prepared at its first run (stream_reads.py).
        rows = read_stream(self, originator_id, gt, lte, desc, limit)
        return [self.opened(e) for e in stored_events(rows)]

    def select_checked(
        self, originator_id: UUID, seal: SnapshotSeal | None = None
    ) -> tuple[list[StoredEvent], list[StoredEventUnreadable]]:
        """Every snapshot of a stream, oldest first: those that read back (seals checked under
        ``seal``, else this recorder's, and stripped), and why each other one does not (``audit
        verify`` names them all)."""
        rows = call_within_deadline(
            lambda: stored_events(read_stream(self, originator_id, None, None, False, None)),
            budget_s=self.deadlines.operation_s,
            pool=self.datastore.pool,
        )
        readable: list[StoredEvent] = []
        unreadable: list[StoredEventUnreadable] = []
        for stored in rows:
            try:
                readable.append(self.opened(stored, seal))
            except StoredEventUnreadable as error:
                unreadable.append(error)
        return readable, unreadable

    def opened(self, stored: StoredEvent, seal: SnapshotSeal | None = None) -> StoredEvent:
        """A stored snapshot with its seal checked under ``seal`` (else this recorder's) and
        stripped; ``StoredEventUnreadable`` when it does not check. One stored unsealed is read
        only as the snapshot an archived session's sealed base holds, byte for byte (archived
        before snapshots were sealed). Without a seal to check with, a seal is stripped unchecked."""
        seal = seal or self.seal
        if seal is None:
            return stripped(stored)
        if is_sealed(stored.state) or not self._archived_as(stored, seal.key):
            return seal.opened(stored)
        return stored

    def _archived_as(self, stored: StoredEvent, key: bytes) -> bool:
        """Whether ``stored`` is the snapshot a base under the chain key seals, at its version."""
        tables = RetentionTables(self.datastore.schema, snapshots=self.events_table_name)
        stream = UUID(str(stored.originator_id))
        with self.datastore.get_connection() as conn:
            rows = conn.row_factory  # the pool's rows are dicts; the tables read tuples
            conn.row_factory = tuple_row  # type: ignore[assignment]
            try:
                bases = tables.bases(conn, key, [stream]) if tables.exists(conn) else {}
            finally:
                conn.row_factory = rows
        found = bases.get(stream)
        return (
            found is not None
            and found.sealed
            and found.base.through_version == stored.originator_version
            and (found.base.snapshot_topic, found.base.snapshot_state) == (stored.topic, stored.state)
        )

    def streams(self) -> list[UUID]:
        """Every stream that has a snapshot (``audit verify`` compares them with their events)."""
        statement = SQL("SELECT DISTINCT originator_id FROM {}.{} ORDER BY originator_id").format(
            Identifier(self.datastore.schema), Identifier(self.events_table_name)
        )

        def read() -> list[UUID]:
            with self.datastore.transaction(commit=False) as curs:
                curs.execute(statement)
                return [row["originator_id"] for row in curs.fetchall()]

        return call_within_deadline(read, budget_s=self.deadlines.operation_s, pool=self.datastore.pool)


class FlowledgerProcessRecorder(PostgresProcessRecorder, FlowledgerApplicationRecorder):
    """Events and the upstream tracking position, written in one transaction."""

    def __init__(
        self,
        datastore: PostgresDatastore,
        *,
        events_table_name: str = "stored_events",
        tracking_table_name: str = "notification_tracking",
    ):
        super().__init__(
            datastore, tracking_table_name=tracking_table_name, events_table_name=events_table_name
        )

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Append events and record ``tracking`` (if given) atomically; no retry, as the plain path."""
        tracking: Tracking | None = kwargs.get("tracking")
        if tracking is None:
            plain: Sequence[int] | None = FlowledgerApplicationRecorder.insert_events(self, stored_events)
            return plain
        ids = self.mended(self._append_tracked, (stored_events, tracking))
        if ids:
            self.notifier.poke()
        return ids

    def _append_tracked(self, arguments: tuple[Sequence[StoredEvent], Tracking]) -> list[int]:
        """One try of the tracked append: a refusal by the log's id sequence (nothing stored)
        comes out as ``sequence_refusal``'s error, for ``mended`` to mend and try again; the
        tracked append had failed on it (``IntegrityError`` on an id taken, ``OperationalError``
        on a cached one) while the plain append mended it."""
        stored_events, tracking = arguments
        with self.datastore.get_connection() as conn:
            try:
                with conn.transaction(), conn.cursor() as curs:
                    # The append must be the transaction's first write (it takes the id).
                    ids = self.append(curs, stored_events) if stored_events else []
                    self._insert_tracking(curs, tracking)
            except psycopg.Error as error:
                # The append function released its lock itself; get_connection maps the error.
                refused = self.sequence_refusal(error, conn)
                if refused is not None:
                    raise refused from error
                raise
            except BaseException:
                close_unfinished(conn)
                raise
        return ids


class FlowledgerPostgresFactory(PostgresFactory):
    """``PostgresFactory`` whose event log is appended without a table lock, within deadlines."""

    aggregate_recorder_class = FlowledgerSnapshotRecorder
    application_recorder_class = FlowledgerApplicationRecorder
    process_recorder_class = FlowledgerProcessRecorder

    def __init__(self, env: Environment | EnvType | None):
        super().__init__(env)
        self.datastore.__class__ = FlowledgerDatastore  # built by the library's __init__, not yet opened
        self.deadlines = Deadlines.from_env(self.env)
        install_pool(self.datastore, self.deadlines, conninfo_to_dict(self.env.get(LIBPQ_PARAMS_KEY) or ""))
        self._notifiers: list[Notifier] = []

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        """The snapshot store's recorder, with this factory's deadlines."""
        recorder = self._made(lambda: super(FlowledgerPostgresFactory, self).aggregate_recorder(purpose))
        self._configure(recorder)
        return recorder

    def application_recorder(self) -> ApplicationRecorder:
        """The event log's recorder; its notifier is stopped when the factory closes."""
        recorder = self._made(super().application_recorder)
        self._configure(recorder)
        return recorder

    def process_recorder(self) -> ProcessRecorder:
        """As ``application_recorder``, with tracking."""
        recorder = self._made(super().process_recorder)
        self._configure(recorder)
        return recorder

    def warm_idle(self) -> None:
        """Warm the pool's idle connections with the recorders' reads (``stream_reads.py``);
        call once the application has made its recorders."""
        pool = self.datastore.pool
        if isinstance(pool, ReconnectingPool):
            pool.warm_idle()

    def close(self) -> None:
        """Stop the notifiers (they hold connections of their own), then the pool."""
        for notifier in self._notifiers:
            notifier.close()
        self._notifiers.clear()
        super().close()

    def _made(self, make: Callable[[], R]) -> R:
        """``make()`` (a recorder, which reads its row type at once), tried again until the
        operation's deadline while the pool finds no connection and the server is not refusing:
        sixteen engines started at once on a loaded machine opened 320 connections, and one
        waited past the pool's timeout (CI: ``StoreUnavailable (start)`` with the server up).
        Within an operation (an engine's start, ``operation_deadline``), its end holds."""
        end = operation_end() or monotonic() + self.deadlines.operation_s
        while True:
            try:
                return make()
            except OperationalError as error:
                verdict = self._unreachable(error)
                if isinstance(verdict, StoreRefused) or monotonic() + _START_PAUSE_S >= end:
                    raise verdict from error
            sleep(_START_PAUSE_S)

    def _unreachable(self, error: OperationalError) -> Exception:
        """Why the pool found no connection at start, which it hides ("couldn't get a
        connection"): one direct connection with the pool's own parameters says it. A server
        that refuses the startup options (PgBouncer, which takes no ``options``) is refused at
        once, naming the setting; anything else is the outage it looks like."""
        try:
            connect_like(self.datastore).close()
        except psycopg.OperationalError as direct:
            detail = " ".join(str(direct).split())
            if STARTUP_OPTIONS_REFUSED in detail:
                # Session pooling refuses them too: the hint said "transaction pooling mode".
                return StoreRefused("start", detail, PGBOUNCER_HINT)
            return StoreUnavailable("start", detail)
        except Exception:  # the direct try says nothing more than the pool did
            pass
        return StoreUnavailable("start", str(error))

    def _configure(self, recorder: object) -> None:
        if isinstance(recorder, FlowledgerApplicationRecorder | FlowledgerSnapshotRecorder):
            recorder.deadlines = self.deadlines
        warm = getattr(self.datastore.pool, "warm_reads", None)  # None behind PgBouncer
        if warm is not None:
            if isinstance(recorder, FlowledgerApplicationRecorder):
                warm.extend(event_reads(recorder.select_events_statement))
            elif isinstance(recorder, FlowledgerSnapshotRecorder):
                warm.extend(snapshot_reads(recorder.select_events_statement))
        if isinstance(recorder, FlowledgerApplicationRecorder):
            self._notifiers.append(recorder.notifier)
