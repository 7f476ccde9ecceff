"""Events a projection could not apply: kept with the error, so that the projection moves on.

An event is a dead letter of a build when it does not decode, when the projection's handler
raises on it, or when the database refuses its rows (a NUL in a text column, a number out
of range, a key past an index's size limit): the fault is the event's, and no retry will
change it. Faults of the database itself (lost connection, timeouts, a missing table,
privileges) are not the event's: they propagate, and the batch is retried as a whole. Dead
letters live in ``<schema>_projections.dead_letters``, one row per (build, notification id),
dropped with their build; a rebuild (after a fix) applies them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import Cursor

from flowledger.domain.values import storable
from flowledger.projections.catalog import Names
from flowledger.projections.sql import q

# Not the event's fault: the database went away or timed out (OperationalError), is
# misconfigured (ProgrammingError from the server: missing table, privileges), or broke
# (InternalError).
_DATABASE_FAULTS = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.ProgrammingError,
    psycopg.InternalError,
    psycopg.NotSupportedError,
)


@dataclass(frozen=True)
class DeadLetter:
    """One event a build could not apply, and why."""

    projection: str
    schema: str
    notification_id: int
    topic: str
    originator_id: Any
    originator_version: int | None
    error: str
    recorded_at: datetime


def is_event_fault(error: BaseException) -> bool:
    """True when applying one event failed because of that event (see the module docstring).
    A row past one of the server's limits (SQLSTATE class 54: a key longer than an index
    takes, say) is the event's too, though psycopg files it under OperationalError; so is a
    value psycopg cannot send as its column's type (a JSON object where a stored row had a step
    name): a ProgrammingError raised by the client, with no SQLSTATE, before the server saw it."""
    if isinstance(error, psycopg.Error) and (error.sqlstate or "").startswith("54"):
        return True
    if isinstance(error, psycopg.ProgrammingError) and error.sqlstate is None:
        return True
    return isinstance(error, Exception) and not isinstance(error, _DATABASE_FAULTS)


def describe(error: BaseException) -> str:
    """The error as one storable line: its type and message."""
    return storable(f"{type(error).__name__}: {error}".strip(), 2000)


def record(
    cur: Cursor[Any],
    names: Names,
    schema: str,
    projection: str,
    rows: list[tuple[int, str, Any, int | None, str]],
) -> None:
    """Store dead letters of one build: (notification id, topic, originator id, version, error)."""
    if not rows:
        return
    cur.executemany(
        q(
            "INSERT INTO {s}.dead_letters (schema_name, projection, notification_id, topic,"
            " originator_id, originator_version, error) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (schema_name, notification_id) DO NOTHING",
            names.control,
        ),
        [(schema, projection, *row) for row in rows],
    )


def listed(
    cur: Cursor[Any], names: Names, *, schemas: list[str] | None = None, limit: int = 100
) -> list[DeadLetter]:
    """Dead letters, newest first (of the given builds only, when given)."""
    cur.execute(
        q(
            "SELECT projection, schema_name, notification_id, topic, originator_id, originator_version,"
            " error, recorded_at FROM {s}.dead_letters"
            " WHERE %(schemas)s::text[] IS NULL OR schema_name = ANY(%(schemas)s)"
            " ORDER BY recorded_at DESC, notification_id DESC LIMIT %(limit)s",
            names.control,
        ),
        {"schemas": schemas, "limit": limit},
    )
    return [DeadLetter(*row) for row in cur.fetchall()]


def events_of(cur: Cursor[Any], names: Names, schemas: list[str]) -> int:
    """How many events the given builds set aside: one event is a dead letter of each build that
    could not apply it, so this counts notification ids, not letters."""
    cur.execute(
        q(
            "SELECT count(DISTINCT notification_id) FROM {s}.dead_letters WHERE schema_name = ANY(%s)",
            names.control,
        ),
        [schemas],
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


def ids_through(cur: Cursor[Any], names: Names, schema: str, position: int) -> dict[int, str]:
    """A build's dead letters up to ``position``: notification id -> error."""
    cur.execute(
        q(
            "SELECT notification_id, error FROM {s}.dead_letters"
            " WHERE schema_name = %s AND notification_id <= %s",
            names.control,
        ),
        [schema, position],
    )
    return {int(row[0]): row[1] for row in cur.fetchall()}
