"""psycopg's errors as the event library's, and what a recorder does with a connection that an
interrupt left in an unknown state."""

from __future__ import annotations

from typing import Any

import psycopg
from eventsourcing.persistence import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
)
from psycopg import Connection

# psycopg's errors as the library's, in the order ``PostgresDatastore.get_connection`` tests them.
_LIBRARY_ERRORS: tuple[tuple[type[psycopg.Error], type[PersistenceError]], ...] = (
    # A write on a standby, or on a promoted one still read-only: a failover under way, a
    # fault of where the connection goes (not of the events), retried like a lost one.
    (psycopg.errors.ReadOnlySqlTransaction, OperationalError),
    (psycopg.InterfaceError, InterfaceError),
    (psycopg.OperationalError, OperationalError),
    (psycopg.DataError, DataError),
    (psycopg.IntegrityError, IntegrityError),
    (psycopg.InternalError, InternalError),
    (psycopg.ProgrammingError, ProgrammingError),
    (psycopg.NotSupportedError, NotSupportedError),
    (psycopg.DatabaseError, DatabaseError),
)


def close_unfinished(conn: Connection[Any]) -> None:
    """After an interrupt (not a database error) mid-call: the call's state on the server is
    unknown, so end the session (which frees anything it held); the pool replaces it."""
    if not conn.closed:
        conn.close()


def library_error(error: psycopg.Error) -> PersistenceError:
    """The event library's exception for a psycopg error (IntegrityError for a version clash)."""
    for theirs, ours in _LIBRARY_ERRORS:
        if isinstance(error, theirs):
            return ours(str(error))
    return PersistenceError(str(error))
