"""One stream's rows as the recorders read them, and the warm-up of a new pooled connection.

A new PostgreSQL backend knows nothing of the tables: its first read of the event and
snapshot tables loads their catalog entries and plans the statement, about 1 ms each on the
2-core bench machine, so a fresh engine's first load of a session took two of those. Each
new pooled connection now runs the same reads once for the nil id, prepared (the pool does
it in its own thread, before the connection is lent), so the first real load finds the
statements prepared and the catalog in memory (``bench_long_sessions.py``, the fresh read:
about 4.5 -> 3.2 ms; ``bench/README.md``). Not behind PgBouncer: a server connection there
serves other clients and keeps no prepared statements of ours.

Both recorders compose their reads here, so the warm-up prepares the very text they run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.postgres import PostgresAggregateRecorder
from psycopg.sql import SQL, Composed, Identifier

log = logging.getLogger(__name__)

NIL = UUID(int=0)
"""No stream has it (the session, task and agent ids are name-based UUIDs)."""

StreamQuery = tuple[Composed, list[Any]]
"""A composed statement and its parameters."""


def stream_query(
    select: Composed,
    originator_id: UUID | str,
    *,
    gt: int | None = None,
    lte: int | None = None,
    desc: bool = False,
    limit: int | None = None,
) -> StreamQuery:
    """``select`` (rows ``WHERE originator_id = %s``) narrowed and ordered as the library's read."""
    statement = select
    params: list[Any] = [originator_id]
    if gt is not None:
        params.append(gt)
        statement += SQL(" AND originator_version > %s")
    if lte is not None:
        params.append(lte)
        statement += SQL(" AND originator_version <= %s")
    statement += SQL(" ORDER BY originator_version DESC" if desc else " ORDER BY originator_version ASC")
    if limit is not None:
        params.append(limit)
        statement += SQL(" LIMIT %s")
    return statement, params


def read_stream(
    recorder: PostgresAggregateRecorder,
    originator_id: UUID | str,
    gt: int | None,
    lte: int | None,
    desc: bool,
    limit: int | None,
) -> list[Any]:
    """The stream's rows (dict rows) from ``recorder``'s table, read as ``stream_query``
    composes them. Not prepared at the first run: psycopg prepares a statement at its 5th on
    a connection (never behind PgBouncer), and a new pooled connection has these prepared
    already (``warm_up``)."""
    select = recorder.select_events_statement
    statement, params = stream_query(select, originator_id, gt=gt, lte=lte, desc=desc, limit=limit)
    with recorder.datastore.get_connection() as conn, conn.cursor() as curs:
        return curs.execute(statement, params, prepare=None).fetchall()


def read_streams(recorder: PostgresAggregateRecorder, originator_ids: Sequence[UUID]) -> list[Any]:
    """The rows (dict rows) of every stream in ``originator_ids``, in one statement, ordered by
    stream and version: a listing of many aggregates reads their events at once instead of
    two round trips for each (``AggregateStore.folded_many``)."""
    statement = SQL(
        "SELECT * FROM {}.{} WHERE originator_id = ANY(%s) ORDER BY originator_id, originator_version"
    )
    table = statement.format(Identifier(recorder.datastore.schema), Identifier(recorder.events_table_name))
    with recorder.datastore.get_connection() as conn, conn.cursor() as curs:
        return curs.execute(table, [list(originator_ids)]).fetchall()


def event_reads(select: Composed) -> list[StreamQuery]:
    """What loading an aggregate reads of its events: all of them, or those after a snapshot."""
    return [stream_query(select, NIL), stream_query(select, NIL, gt=0)]


def snapshot_reads(select: Composed) -> list[StreamQuery]:
    """What loading an aggregate reads of its snapshots: the latest one."""
    return [stream_query(select, NIL, desc=True, limit=1)]


def warm_up(conn: psycopg.Connection[Any], queries: Sequence[StreamQuery]) -> None:
    """Run each read once, prepared, on a new connection in autocommit (as the pool's are;
    psycopg forgets what it prepared at a rollback, so another connection is left as it is).
    A table not yet created (before ``migrate``) or a read refused is skipped: the warm-up
    only saves time. A connection lost meanwhile raises, so the pool makes another."""
    if not conn.autocommit:
        return
    for statement, params in queries:
        try:
            conn.execute(statement, params, prepare=True).fetchall()
        except psycopg.Error as error:
            if conn.broken or conn.closed:
                raise
            log.debug("warm-up read skipped: %s", error)
