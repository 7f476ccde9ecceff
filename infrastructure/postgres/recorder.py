"""flowledger's PostgreSQL application recorder: concurrent appends, gap-safe readers.

The library's recorder takes ``LOCK TABLE … IN EXCLUSIVE MODE`` per save and holds it
through commit, so that notification ids become visible in id order and a reader
tailing the log never passes an id that commits later. That queues every writer
behind the previous writer's WAL flush. This recorder keeps the guarantee without it.

Mechanism (transaction ids and a horizon, as Marten, Emmett and the Commanded event
store do, but with the horizon taken from this log's own appends in flight):

1. Each row stores the id of the transaction that appended it (``transaction_id``,
   ``xid8``). An append is one call of a PL/pgSQL function, in its own transaction.
2. Inside the function a session advisory lock is held only while the transaction
   takes its id (``pg_current_xact_id()``), a marker lock keyed by that id
   (``pg_advisory_xact_lock_shared``, held until the transaction ends) and its
   notification ids (``nextval``); the insert and the commit run outside it,
   concurrently. So a transaction that took lower notification ids always has a lower
   transaction id, and its marker existed before any later append took an id.
   (So the function refuses to run in a transaction that already has an id.)
3. A reader first reads the horizon (``horizon.py``): the lowest transaction id among
   the markers (the appends to this log still in flight), else its snapshot's xmax. In a
   second statement (a later snapshot) it treats a row as readable only when its
   ``transaction_id`` is below that horizon. Every append that took a lower id has then
   finished and is in the second snapshot: readable rows form a prefix of the log in id
   order, and a reader that remembers the last id it consumed skips nothing. Transactions
   that never append to this log (another table, another database) play no part.
4. A reader waits (briefly, bounded by ``horizon_wait``) for rows that were committed
   before it asked but were still behind the horizon, so a caller reads its own writes.

Optimistic concurrency is the primary key (originator_id, originator_version); a
multi-event save is one statement in one transaction. Snapshots use the library's
aggregate recorder unchanged (no notification ids, no lock). On a hot standby the
primary's markers are not visible, so the horizon there is the snapshot's xmin
(``sql.horizon``): gap-safe, but held back by any transaction open on the primary's cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from time import monotonic, sleep
from typing import Any, TypeVar, cast
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    ApplicationRecorder,
    Notification,
    OperationalError,
    StoredEvent,
    Subscription,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import Connection, Cursor
from psycopg.rows import DictRow, tuple_row
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventAltered, StoreUnavailable, WriteRefusedByDatabase
from flowledger.infrastructure.postgres import binary_arrays
from flowledger.infrastructure.postgres import sql as pg_sql
from flowledger.infrastructure.postgres.chain import Heads, StreamChain
from flowledger.infrastructure.postgres.ddl import append_function_name
from flowledger.infrastructure.postgres.deadlines import Deadlines, call_within_deadline
from flowledger.infrastructure.postgres.group_commit import GroupCommit
from flowledger.infrastructure.postgres.horizon import Horizon, HorizonLag
from flowledger.infrastructure.postgres.literal_append import append_then_commit
from flowledger.infrastructure.postgres.migrations import (
    create_event_log,
    force_sequence_cache_1,
    repair_sequence_order,
)
from flowledger.infrastructure.postgres.not_sent import AppendNotSent
from flowledger.infrastructure.postgres.notify import FlowledgerSubscription, Notifier, channel_name
from flowledger.infrastructure.postgres.prepared_append import PreparedAppend
from flowledger.infrastructure.postgres.recorder_errors import close_unfinished, library_error
from flowledger.infrastructure.postgres.stream_reads import read_stream, read_streams
from flowledger.infrastructure.postgres.watchdog import watching

_CLOSE_AFTER = (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.QueryCanceled)
_CURSOR_ATTRIBUTE = "_flowledger_append_cursor"
_IDLE = psycopg.pq.TransactionStatus.IDLE
S = TypeVar("S")
T = TypeVar("T")


class _SequenceRefused(Exception):
    """The append function took an id it would not store (nothing stored): ``mended`` mends it."""


class _IdFromCache(_SequenceRefused):
    """The append function refused an id handed out from a sequence cache (nothing stored)."""


def _cached_id(error: psycopg.Error) -> bool:
    return isinstance(error, psycopg.errors.ObjectNotInPrerequisiteState) and (
        pg_sql.ID_FROM_SEQUENCE_CACHE in str(error)
    )


_REFUSED_BY_DATABASE = (
    psycopg.errors.RaiseException,
    psycopg.errors.CheckViolation,
    psycopg.errors.ForeignKeyViolation,
    psycopg.errors.RestrictViolation,
)
"""What the append meets only from a rule added in the database: flowledger's own refusals are a
unique violation (a version clash, retention's guard) and object_not_in_prerequisite_state."""


class _IdOutOfOrder(_SequenceRefused):
    """The append took an id a stored event has: the sequence was set back, made to count
    down or to cycle, or a row was moved to the id it hands out next (nothing stored)."""

    def __init__(self, message: str, taken: int | None) -> None:
        super().__init__(message)
        self.taken = taken
        """The id the append took and found stored (None: not in the server's detail)."""


_KEY_DETAIL = re.compile(r"=\((-?\d+)")
"""The first key value of a unique violation's detail: ``Key (notification_id)=(3) already
exists`` (``(notification_id, originator_id)=(3, …)`` on a partitioned log)."""


def _id_out_of_order(error: psycopg.Error) -> bool:
    """A stored event's notification id taken again: the unique index on ids (of the table, or
    of a partition holding the same stream) refused it. A sequence at its maximum fails
    inside the id section instead, and is left to ``migrate`` at the next start."""
    return isinstance(error, psycopg.errors.UniqueViolation) and (
        "notification_id" in (error.diag.constraint_name or "")
    )


def _unmended(refused: _SequenceRefused) -> StoreUnavailable:
    """The caller's error when the sequence refused an id after every mend (nothing stored)."""
    if isinstance(refused, _IdFromCache):
        return StoreUnavailable(
            "append",
            f"{pg_sql.ID_FROM_SEQUENCE_CACHE}; nothing was stored. Set it with `flowledger migrate`"
            f" ({refused})",
        )
    return StoreUnavailable(
        "append",
        "the event log's id sequence hands out ids at or below stored ones; nothing was"
        f" stored. Set it right with `flowledger migrate` ({refused})",
    )


class ReadTopics(tuple[str, ...]):
    """The topics a reader of notifications handles, and (``known``) every topic this release
    has an event class for: a read of them also returns the rows of a topic not known, a newer
    release's or one edited in the database, which the projections name rather than pass over.
    A tuple, so that the library's subscription passes it to ``select_notifications`` as it is
    (and a recorder that knows nothing of it reads the topics alone)."""

    known: tuple[str, ...]

    def __new__(cls, topics: Iterable[str], known: Iterable[str]) -> ReadTopics:
        made = super().__new__(cls, topics)
        made.known = tuple(known)
        return made


class FlowledgerApplicationRecorder(PostgresApplicationRecorder):
    """Appends without a table lock; reads only the gap-free prefix of the log."""

    horizon_wait = 2.0
    """Seconds a read waits for rows committed before it that are behind the horizon."""

    deadlines = Deadlines()
    """Set by the factory from Settings: reads retry within ``operation_s``; under PgBouncer
    nothing is prepared on the server."""

    event_partitions: int = 0
    """The layout ``create_table`` makes (hash partitions by stream; 0: unpartitioned). Only for
    recorders built by hand: an engine's table is made by ``migrate`` from ``Settings``."""

    chain: StreamChain | None = None
    """Set by the Engine (``Settings.audit_chain``): each append stores its events' hashes and
    seals; None stores them unchained (recorders built by hand, the chain switched off)."""

    group: GroupCommit | None = None
    """Set by the Engine (``Settings.group_commit``): concurrent appends share a transaction
    (``group_commit.py``); None: each append commits on its own."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name=events_table_name)
        schema = self.datastore.schema
        self.sql_create_statements[self.create_table_statement_index] = pg_sql.create_table(
            schema, self.events_table_name, self.datastore.originator_id_type
        )[0]
        # The append function needs the table's sequence name: made in _create_table.
        del self.sql_create_statements[self.create_insert_function_statement_index]
        # ... and its notification index, made by ``create_event_log`` to fit the table's layout
        # (the library's cannot be made on a partitioned table, even where it exists already).
        self.sql_create_statements = [
            statement
            for statement in self.sql_create_statements
            if self.notification_id_index_name not in statement.as_string(None)
        ]
        self.append_function_name = append_function_name(self.events_table_name)
        # Rendered once to plain strings: psycopg parses a string query once and caches it,
        # but renders a ``Composed`` again on every call.
        self.sql_append_one = (
            SQL("SELECT {}.{}(%s, %s, %s, %s, %s, %s) AS id")
            .format(
                Identifier(schema), Identifier(f"{self.append_function_name}_one"[: self.MAX_IDENTIFIER_LEN])
            )
            .as_string(None)
        )
        # The same one-event call through libpq directly (``prepared_append.py``), for uuid ids.
        self.prepared_one = (
            PreparedAppend(
                SQL("{}.{}")
                .format(
                    Identifier(schema),
                    Identifier(f"{self.append_function_name}_one"[: self.MAX_IDENTIFIER_LEN]),
                )
                .as_string(None)
            )
            if self.datastore.originator_id_type == "uuid"
            else None
        )
        # Several events' arrays in binary, built by hand (``binary_arrays.py``); None sends
        # Python lists through psycopg's list dumper (``bench/bench_append_call.py`` compares).
        self.encode_arrays: binary_arrays.Encoder | None = binary_arrays.append_arrays
        self.sql_append_function = (
            SQL("{}.{}").format(Identifier(schema), Identifier(self.append_function_name)).as_string(None)
        )
        self.sql_append = f"SELECT id FROM {self.sql_append_function}(%s, %s, %s, %s, %s, %s) AS id"
        table = self.events_table_name
        self.sql_max_notification_id = pg_sql.max_notification_id(schema, table).as_string(None)
        self.sql_committed_max = pg_sql.committed_max_notification_id(schema, table).as_string(None)
        self.horizon = Horizon(schema, self.events_table_name)
        # The row at the version known comes along (>=), so that the first new row's content
        # is checked against its predecessor's hash (``select_events_after``).
        self.sql_events_after = (
            SQL(
                "SELECT e.originator_id, e.originator_version, e.topic, e.state, e.event_hash, e.event_mac "
                "FROM unnest(%s::uuid[], %s::bigint[]) AS a(id, known) "
                "JOIN {}.{} e ON e.originator_id = a.id AND e.originator_version >= a.known "
                "ORDER BY e.originator_id, e.originator_version"
            )
            .format(Identifier(schema), Identifier(table))
            .as_string(None)
        )
        self.sql_rows_checked = (
            SQL(
                "SELECT e.originator_id, e.originator_version, e.event_hash, e.event_mac,"
                " p.event_hash AS previous_hash FROM unnest(%s::uuid[], %s::bigint[]) AS a(id, v)"
                " JOIN {s}.{t} e ON e.originator_id = a.id AND e.originator_version = a.v"
                " LEFT JOIN {s}.{t} p ON p.originator_id = e.originator_id"
                " AND p.originator_version = e.originator_version - 1"
            )
            .format(s=Identifier(schema), t=Identifier(table))
            .as_string(None)
        )
        # Its senders and listeners are this class's, so both name the schema (``channel_name``).
        self.channel_name = channel_name(schema, table)
        self.notifier = Notifier(self.datastore, self.channel_name)

    def _create_table(self, curs: Cursor[DictRow]) -> None:
        """Only for tests and tools that build a recorder by hand: engines call ``migrate``.

        The event log (in the ``event_partitions`` layout) is made first, once; the library's
        own statements then find it there."""
        create_event_log(
            curs,
            self.datastore.schema,
            self.events_table_name,
            self.datastore.originator_id_type,
            partitions=self.event_partitions,
        )
        super()._create_table(curs)

    @property
    def prepare(self) -> bool | None:
        """``prepare=`` for this recorder's statements: never prepared behind PgBouncer."""
        return None if self.deadlines.pgbouncer else True

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Append ``stored_events`` atomically; returns their notification ids.

        No retry here: a failed append raises at once (as the library's error), because
        after a lost reply only the caller can tell whether its commit happened (the
        engine's store reads the stream back before it tries again). With ``transaction``
        (an open transaction's connection) the append commits that transaction.
        """
        if not stored_events:
            return []
        transaction: Connection[Any] | None = kwargs.get("transaction")
        if transaction is not None:  # a connection of the caller's, not the pool's: watched here
            with watching(transaction):
                return self.append_and_commit(transaction, stored_events)
        if self.group is not None:
            return self.group.append(stored_events)
        return self.append_now(stored_events)

    def append_now(self, stored_events: Sequence[StoredEvent]) -> list[int]:
        """Append ``stored_events`` in a transaction of their own (a pooled connection), the
        sequence mended as ``mended`` says (group commit writes through here too)."""
        return self.mended(self._append_pooled, stored_events)

    def mended(self, append: Callable[[S], T], arguments: S) -> T:
        """``append(arguments)`` (an append in a transaction of its own), tried again after the
        sequence is mended when it refused an id (``sequence_refusal``: nothing was stored).

        An id from a sequence cache (``sql.ID_FROM_SEQUENCE_CACHE``: someone gave the sequence a
        cache while engines ran): the cache is set back to 1 (the refused connection, which holds
        the cached block, was closed). An id a stored event has (the sequence set back, made to
        count down or cycle): the sequence is set past the highest stored id. At most once per
        pooled connection; past that, or when this role may not alter the sequence, the caller
        gets a ``FlowledgerError`` saying so.
        """
        for _ in range(self.datastore.pool.max_size):
            try:
                return append(arguments)
            except _SequenceRefused as refused:
                self._mend(refused)
        try:
            return append(arguments)
        except _SequenceRefused as refused:
            raise _unmended(refused) from refused

    def _mend(self, refused: _SequenceRefused) -> None:
        if isinstance(refused, _IdFromCache):
            self._force_cache_1()
        else:
            self._repair_sequence_order(refused.taken if isinstance(refused, _IdOutOfOrder) else None)

    def sequence_refusal(self, error: psycopg.Error, conn: Connection[Any]) -> _SequenceRefused | None:
        """What ``mended`` mends, for an append's ``error`` on ``conn`` (None: any other error):
        an id from a sequence cache (``conn`` is then closed: its backend holds the cached
        block), or an id a stored event has. Either way the append stored nothing."""
        if _cached_id(error):
            conn.close()
            return _IdFromCache(str(error))
        if _id_out_of_order(error):
            found = _KEY_DETAIL.search(error.diag.message_detail or "")
            return _IdOutOfOrder(str(error).splitlines()[0], int(found.group(1)) if found else None)
        return None

    def _force_cache_1(self) -> None:
        """``ALTER SEQUENCE ... CACHE 1`` on a pooled connection (``MigrationRefused`` when
        this role is not the sequence's owner)."""
        with self.datastore.pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            force_sequence_cache_1(cur, self.datastore.schema, self.events_table_name)

    def _repair_sequence_order(self, taken: int | None) -> None:
        """``repair_sequence_order`` in a transaction of a pooled connection (``MigrationRefused``
        when this role may not alter the sequence): an operator set it back, made it count down
        or cycle while engines ran, and every append then collided with a stored id, retried as
        a version clash until ``ConcurrentUpdate``; or a row was moved to the id the sequence
        hands out next (``taken``, recorded: the failed append drew it, so it was no longer past
        the sequence, and the move went unrecorded and unnamed)."""
        with self.datastore.pool.connection() as conn, conn.transaction():
            repair_sequence_order(conn.cursor(), self.datastore.schema, self.events_table_name, taken=taken)

    def _append_pooled(self, stored_events: Sequence[StoredEvent]) -> list[int]:
        pool = self.datastore.pool
        if pool.closed:  # not opened yet (or closed): the library opens it, or says why not
            with self.datastore.get_connection():
                pass
        # The pool directly, not the library's ``get_connection``: on this hot path its
        # context managers and the connection's ``with`` block cost a tenth of a step.
        try:
            conn = pool.getconn()
        except psycopg.Error as error:  # PoolTimeout is an OperationalError
            mapped = library_error(error)
            if isinstance(mapped, OperationalError):  # no connection: nothing was sent
                raise AppendNotSent(str(error)) from error
            raise mapped from error
        try:
            curs = self._append_cursor(conn)
            try:
                ids = self.append(curs, stored_events, prepared=self._prepared_for(stored_events))
            except psycopg.Error as error:
                # The function released the id section's lock itself (its exception
                # block), so the connection goes back to the pool as it is; unless it
                # reached a read-only server, which it will never write to (closed, the
                # pool replaces it: ``target_session_attrs=read-write`` finds the primary),
                # or was cancelled (a statement timeout, ``pg_cancel_backend``): a second
                # cancel can stop the handler before its unlock, and a closed backend
                # holds no lock. Rare, so the reconnect costs nothing that matters.
                if isinstance(error, _CLOSE_AFTER):
                    conn.close()
                refused = self.sequence_refusal(error, conn)
                if refused is not None:
                    raise refused from error
                if isinstance(error, _REFUSED_BY_DATABASE):
                    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
                    table = f"{self.datastore.schema}.{self.events_table_name}"
                    raise WriteRefusedByDatabase("append", detail, table) from error
                raise library_error(error) from error
            except BaseException:
                close_unfinished(conn)
                raise
        finally:
            pool.putconn(conn)
        self.notifier.poke()
        return ids

    @staticmethod
    def _append_cursor(conn: Connection[Any]) -> Cursor[Any]:
        """This connection's append cursor, made once (plain tuple rows: a dict per row costs
        more). A new cursor would look up its parameter dumpers and row loaders again on
        every call. It lives on the connection (not in a weak mapping, which the cursor's
        reference back to its connection would keep alive forever), so both go together."""
        curs: Cursor[Any] | None = getattr(conn, _CURSOR_ATTRIBUTE, None)
        if curs is None or curs.closed:
            curs = conn.cursor(row_factory=tuple_row)
            setattr(conn, _CURSOR_ATTRIBUTE, curs)
        return curs

    def _prepared_for(self, stored_events: Sequence[StoredEvent]) -> PreparedAppend | None:
        """``prepared_one`` when it can send these events: one, with a uuid id, not behind PgBouncer."""
        if len(stored_events) == 1 and self.prepare and isinstance(stored_events[0].originator_id, UUID):
            return self.prepared_one
        return None

    def append(
        self,
        curs: Cursor[Any],
        stored_events: Sequence[StoredEvent],
        *,
        prepared: PreparedAppend | None = None,
    ) -> list[int]:
        """Append on ``curs`` (its transaction commits them); returns the notification ids.

        Must be the first write of its transaction (the call takes the transaction id).
        With ``prepared`` (one event, ``_prepared_for``) the call goes through libpq's
        prepared call on the same connection instead of psycopg's ``execute``.
        """
        if curs.row_factory is not tuple_row:
            curs = curs.connection.cursor(row_factory=tuple_row)  # same transaction
        hashes, macs, heads = self._seal(curs, stored_events)
        if prepared is not None:
            e = stored_events[0]
            stream = cast(UUID, e.originator_id)  # ``_prepared_for`` checked it
            ids = [
                prepared(curs.connection, stream, e.originator_version, e.topic, e.state, hashes[0], macs[0])
            ]
        else:
            self._send_append(curs, stored_events, hashes, macs)
            ids = self._appended_ids(curs, stored_events)
        # Outside a transaction block the call was the commit; inside a caller's transaction
        # the heads are not remembered (it may still roll back): the next append reads them.
        # (``pgconn`` directly: ``info`` builds an object and an enum on every call.)
        if self.chain is not None and heads and curs.connection.pgconn.transaction_status == _IDLE:
            self.chain.committed(heads, len(stored_events))
        return ids

    def append_and_commit(self, conn: Connection[Any], stored_events: Sequence[StoredEvent]) -> list[int]:
        """Append in ``conn``'s open transaction and commit it, in one round trip: how a
        batch of assignments saves under the agent locks its transaction holds (the commit
        releases them, ``agent_locks.py``). On an error the transaction is left for its
        owner to roll back. Raises the library's errors, as ``insert_events``."""
        curs = self._append_cursor(conn)
        try:
            hashes, macs, heads = self._seal(curs, stored_events)
            query = append_then_commit(self.sql_append_function, stored_events, hashes, macs)
            if query is not None:  # one query string: the call, then COMMIT (``literal_append.py``)
                curs.execute(query, prepare=False)
            else:
                with conn.pipeline():
                    self._send_append(curs, stored_events, hashes, macs)
                    conn.commit()
            ids = self._appended_ids(curs, stored_events)
        except psycopg.Error as error:
            refused = self.sequence_refusal(error, conn)
            if refused is None:
                raise library_error(error) from error
            # The caller's transaction (holding its locks) is over: mend the sequence here, and
            # let the caller decide again in a new one. Retried as a version clash, each attempt
            # met the same refusal (193 times, then StoreUnavailable, after a ``setval`` back).
            self._mend(refused)
            raise AppendNotSent(
                f"the event log's id sequence was mended; nothing was stored ({refused})"
            ) from error
        except BaseException:
            close_unfinished(conn)
            raise
        if self.chain is not None and heads:
            self.chain.committed(heads, len(stored_events))
        self.notifier.poke()
        return ids

    def _seal(
        self, curs: Cursor[Any], stored_events: Sequence[StoredEvent]
    ) -> tuple[list[bytes | None], list[bytes | None], Heads | None]:
        chain = self.chain
        if chain is None:
            return [None] * len(stored_events), [None] * len(stored_events), None
        sealed, sealed_macs, heads = chain.seal(curs, stored_events, self.prepare)
        return list(sealed), list(sealed_macs), heads

    def _send_append(
        self,
        curs: Cursor[Any],
        stored_events: Sequence[StoredEvent],
        hashes: list[bytes | None],
        macs: list[bytes | None],
    ) -> None:
        if len(stored_events) == 1:
            e = stored_events[0]
            curs.execute(
                self.sql_append_one,
                (e.originator_id, e.originator_version, e.topic, e.state, hashes[0], macs[0]),
                prepare=self.prepare,
            )
            return
        arrays = None if self.encode_arrays is None else self.encode_arrays(stored_events, hashes, macs)
        if arrays is not None:  # uuid ids
            curs.execute(self.sql_append, arrays, prepare=self.prepare)
            return
        curs.execute(
            self.sql_append,
            (
                [e.originator_id for e in stored_events],
                [e.originator_version for e in stored_events],
                [e.topic for e in stored_events],
                [e.state for e in stored_events],
                hashes,
                macs,
            ),
            prepare=self.prepare,
        )

    @staticmethod
    def _appended_ids(curs: Cursor[Any], stored_events: Sequence[StoredEvent]) -> list[int]:
        ids = [row[0] for row in curs.fetchall()]
        if len(ids) != len(stored_events):  # the function returns one id per event
            raise OperationalError(
                f"append returned {len(ids)} notification ids for {len(stored_events)} events"
            )
        return ids

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The library's read of one stream, retried within the operation deadline (not 10
        times). With the chain on, a row whose hash or seal does not check is
        ``StoredEventAltered`` (``StreamChain.altered``), and the chain learns the hash of the
        newest event read, so an append after a load does not read it again (a task another
        process created, say)."""
        return self._within_deadline(lambda: self._select_events(originator_id, gt, lte, desc, limit))

    def _select_events(
        self, originator_id: UUID | str, gt: int | None, lte: int | None, desc: bool, limit: int | None
    ) -> list[StoredEvent]:
        chain = self.chain
        # The row before the first asked for comes along (same statement), so that the first
        # one's content is checked against its predecessor's hash too (a load after a snapshot).
        widen = chain is not None and gt is not None and gt > 0 and not desc and limit is None
        rows = read_stream(self, originator_id, gt - 1 if widen and gt else gt, lte, desc, limit)
        if chain is not None and rows:
            for altered in chain.altered(rows[::-1] if desc else rows).values():
                raise altered
            newest = rows[0] if desc else rows[-1]
            if newest["event_hash"] is not None:
                chain.note_head(
                    newest["originator_id"], newest["originator_version"], bytes(newest["event_hash"])
                )
        if widen and rows and rows[0]["originator_version"] == gt:
            rows = rows[1:]
        return stored_events(rows)

    def select_streams(self, originator_ids: Sequence[UUID]) -> list[StoredEvent]:
        """Every event of the streams in ``originator_ids``, by stream then version, in one
        read within the operation deadline (the chain learns each stream's newest hash); a
        stream with a row whose hash or seal does not check is left out."""

        def read() -> list[StoredEvent]:
            rows = read_streams(self, originator_ids)
            chain = self.chain
            if chain is not None:
                # A stream with an altered row is left out: its own load names it.
                altered = chain.altered(rows)
                if altered:
                    rows = [row for row in rows if row["originator_id"] not in altered]
                newest = {row["originator_id"]: row for row in rows}  # rows come in version order
                for row in newest.values():
                    if row["event_hash"] is not None:
                        chain.note_head(
                            row["originator_id"], row["originator_version"], bytes(row["event_hash"])
                        )
            return stored_events(rows)

        return self._within_deadline(read)

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Notifications from ``start`` in id order, up to the first that may still move; of
        ``topics`` when given, and of every topic not known too when they are ``ReadTopics``."""
        return self._within_deadline(
            lambda: self._select_notifications(start, limit, stop, topics, inclusive_of_start)
        )

    def _within_deadline(self, read: Callable[[], T]) -> T:
        return call_within_deadline(read, budget_s=self.deadlines.operation_s, pool=self.datastore.pool)

    def _select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None,
        topics: Sequence[str],
        inclusive_of_start: bool,
    ) -> Sequence[Notification]:
        known = topics.known if isinstance(topics, ReadTopics) else ()
        unknown = bool(topics) and bool(known)
        statement = pg_sql.select_notifications(
            self.datastore.schema,
            self.events_table_name,
            inclusive=inclusive_of_start,
            has_start=start is not None,
            has_stop=stop is not None,
            has_topics=bool(topics),
            has_unknown=unknown,
        )
        params: list[Any] = [p for p in (start, stop) if p is not None]
        if topics:
            params.append(list(topics))
        if unknown:
            params.append(list(known))
        params.append(limit)
        deadline = monotonic() + self.horizon_wait
        prepare = self.prepare
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            horizon = self.horizon.read(curs, prepare=prepare)
            rows = curs.execute(statement, [horizon, *params], prepare=prepare).fetchall()
            held_back = [row["tx"] for row in rows if not row["safe"]]
            # Rows committed before this call: wait once for the last of them, re-read.
            # Re-read even if that wait ran out: the rows before it may have passed
            # (the last may never pass: a row from another cluster that this role may not repair).
            if held_back:
                if self.horizon.repair_foreign(curs, held_back):
                    horizon = self.horizon.read(curs, prepare=prepare)
                else:
                    horizon = self.horizon.wait_past(curs, held_back[-1], deadline, prepare=prepare)
                rows = curs.execute(statement, [horizon, *params], prepare=prepare).fetchall()
        notifications: list[Notification] = []
        for row in rows:
            if not row["safe"]:
                break
            notifications.append(
                Notification(
                    id=row["notification_id"],
                    originator_id=row["originator_id"],
                    originator_version=row["originator_version"],
                    # A topic set NULL in the database is one no class has, read as "" (a str,
                    # as the hash check and the dead letters need): named, not a crash.
                    topic=row["topic"] if row["topic"] is not None or not unknown else "",
                    state=payload(row),
                )
            )
        return notifications

    def select_events_after(self, known: Sequence[tuple[UUID, int]]) -> list[StoredEvent]:
        """Each stream's events after the version given, in one statement, oldest first per
        stream. Gap-free without the horizon: a stream's next version is only ever written
        by a writer that read the one before it committed."""
        if not known:
            return []
        ids = binary_arrays.uuids([stream for stream, _ in known])
        versions = binary_arrays.int8s([version for _, version in known])

        def read() -> list[StoredEvent]:
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                rows = curs.execute(self.sql_events_after, (ids, versions), prepare=self.prepare).fetchall()
            chain = self.chain
            if chain is not None:
                for altered in chain.altered(rows).values():
                    raise altered
            after = dict(known)
            return stored_events(
                [row for row in rows if row["originator_version"] > after[row["originator_id"]]]
            )

        return self._within_deadline(read)

    def altered_among(
        self, notifications: Sequence[Notification]
    ) -> dict[tuple[Any, int], StoredEventAltered]:
        """Which of ``notifications`` (rows read from the log's tail, without their hashes) a read
        refuses to serve, by (stream, version): each one's topic and payload as read are checked
        against its stored hash after its predecessor's, and its hash against its seal
        (``StreamChain.altered_alone``), in one statement. None with the chain off.

        The task index folded the tail of ``Task.Created`` (and ``Classified``, ``Requeued``) rows
        unchecked, while every read of a stream refused an edited row: a deadline or priority edited
        in the database was what the index planned and swept from."""
        chain = self.chain
        if chain is None or not notifications:
            return {}
        ids = binary_arrays.uuids([UUID(str(n.originator_id)) for n in notifications])
        versions = binary_arrays.int8s([n.originator_version for n in notifications])

        def read() -> list[Any]:
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                return curs.execute(self.sql_rows_checked, (ids, versions), prepare=self.prepare).fetchall()

        stored = {
            (row["originator_id"], row["originator_version"]): row for row in self._within_deadline(read)
        }
        found: dict[tuple[Any, int], StoredEventAltered] = {}
        for n in notifications:
            key = (n.originator_id, n.originator_version)
            row = stored.get(key)
            if row is None:
                continue  # deleted since it was read: nothing to check it against (audit verify names it)
            altered = chain.altered_alone({**row, "topic": n.topic, "state": n.state})
            if altered is not None:
                found[key] = altered
        return found

    def select_events_containing(self, originator_id: Any, topic: str, needle: bytes) -> list[StoredEvent]:
        """One stream's events of ``topic`` whose stored bytes contain ``needle``, oldest first.

        The server scans the stream (no rows cross the wire but the matches): how an old
        idempotency key is found in a long session without decoding every event. With the chain
        on, each match is checked as a read is (``StreamChain.altered_alone``, its predecessor's
        hash joined in the same statement): an old step's output edited in the database had been
        what a retry under its key was answered.
        """
        statement = pg_sql.select_events_containing(self.datastore.schema, self.events_table_name)
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            rows = curs.execute(statement, (originator_id, topic, needle), prepare=self.prepare).fetchall()
        chain = self.chain
        if chain is not None:
            for row in rows:
                altered = chain.altered_alone(row)
                if altered is not None:
                    raise altered
        return stored_events(rows)

    def max_notification_id(self) -> int | None:
        """The highest notification id a reader may consume up to now."""
        return self._within_deadline(self._max_notification_id)

    def _max_notification_id(self) -> int | None:
        deadline = monotonic() + self.horizon_wait
        prepare = self.prepare
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            horizon = self.horizon.read(curs, prepare=prepare)
            statement = self.sql_max_notification_id
            row = curs.execute(statement, (horizon, horizon), prepare=prepare).fetchone()
            if row is None:
                return None
            if row["last_safe"] is False:
                if self.horizon.repair_foreign(curs, [row["last_tx"]]):
                    horizon = self.horizon.read(curs, prepare=prepare)
                else:
                    horizon = self.horizon.wait_past(curs, row["last_tx"], deadline, prepare=prepare)
                row = curs.execute(statement, (horizon, horizon), prepare=prepare).fetchone()
            return None if row is None else row["safe_max"]

    def committed_max_notification_id(self) -> int:
        """The highest notification id of any committed row, readable or not (0: an empty log)."""

        def read() -> int:
            with self.datastore.get_connection() as conn:
                row = conn.execute(self.sql_committed_max, prepare=self.prepare).fetchone()
            return int(row["m"] or 0) if row else 0

        return self._within_deadline(read)

    def readable_through(self, notification_id: int, timeout: float) -> bool:
        """Whether every row up to ``notification_id`` is readable, waiting up to ``timeout`` s.

        Once true it stays true (the readable prefix only grows), so a read that starts
        afterwards reaches at least that id: how a caller makes sure it decides from every
        event committed before it asked (``LogIndex``).
        """
        if notification_id <= 0:
            return True
        deadline = monotonic() + timeout
        delay = 0.002
        while True:
            readable = self._within_deadline(self._readable_max)
            if readable >= notification_id:
                return True
            if monotonic() + delay >= deadline:
                return False
            sleep(delay)
            delay = min(delay * 2, 0.05)

    def _readable_max(self) -> int:
        prepare = self.prepare
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            horizon = self.horizon.read(curs, prepare=prepare)
            row = curs.execute(self.sql_max_notification_id, (horizon, horizon), prepare=prepare).fetchone()
        return int(row["safe_max"] or 0) if row else 0

    def horizon_lag(self) -> HorizonLag:
        """How far readers are held behind the newest committed row: ids, rows and seconds."""

        def read() -> HorizonLag:
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                return self.horizon.lag(curs, prepare=self.prepare)

        return self._within_deadline(read)

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """Follow the log live: LISTEN for appends, and re-read on a short timer."""
        return FlowledgerSubscription(recorder=self, gt=gt, topics=topics)


def payload(row: Any) -> bytes:
    """A row's payload as bytes; a NULL one (set so in the database) as no bytes, which the
    mapper names as an unreadable row instead of a TypeError here."""
    state = row["state"]
    return b"" if state is None else bytes(state)


def stored_events(rows: list[Any]) -> list[StoredEvent]:
    """Rows of the events table (dict rows) as the library's stored events."""
    return [
        StoredEvent(
            originator_id=row["originator_id"],
            originator_version=row["originator_version"],
            topic=row["topic"],
            state=payload(row),
        )
        for row in rows
    ]
