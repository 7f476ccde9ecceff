"""Which psycopg errors mean the database could not answer, as against a statement that is wrong.

A caller that may go on without an answer (``agent_locks.py``: deciding without locks is
safe, only slower) must tell the two apart: a lost connection, a cancelled or timed-out
statement, a server shutting down or out of resources says nothing about the statement and
will pass; a syntax error, an undefined column or function, a wrong parameter type, a
statement sent on a transaction we left aborted is a bug of ours, and going on would hide it.

psycopg's classes do not draw that line (a server that ended an idle transaction raises an
``InternalError``; a statement too complex for the server, an ``OperationalError``), so the
SQLSTATE does, where the server sent one.
"""

from __future__ import annotations

import psycopg

UNANSWERED_CLASSES = frozenset({"08", "40", "53", "57", "58", "XX"})
"""SQLSTATE classes of a database that could not answer: 08 connection exception, 40
transaction rollback (serialization failure, deadlock detected: two waiters on each other's
locks), 53 insufficient resources (too many connections, out of memory or disk, the lock
table full), 57 operator intervention (query_canceled: a statement or lock timeout, the
watchdog's cancel; admin_shutdown: pg_terminate_backend, a failover; crash_shutdown,
cannot_connect_now, idle_session_timeout), 58 system error (I/O outside PostgreSQL), XX
internal error (the server's own fault, such as corrupted data: a read elsewhere meets it too)."""

UNANSWERED_STATES = frozenset({"55P03", "25P03", "25P04"})
"""Single SQLSTATEs of a database that could not answer, in classes that otherwise mean a
wrong statement or state of ours: lock_not_available (``lock_timeout``),
idle_in_transaction_session_timeout and transaction_timeout (the server ended a transaction
that outlived its limit; psycopg raises both as ``InternalError``)."""


def unanswered(error: psycopg.Error) -> bool:
    """Whether ``error`` is the database failing to answer (see the module docstring), not a
    statement of ours it refused or a misuse of psycopg."""
    state = error.sqlstate
    if state is None:
        # Raised by the client, without a server's word: a connection that failed, was lost
        # or timed out is an OperationalError; the rest (InterfaceError, ProgrammingError,
        # DataError from adapting a value) is a misuse of psycopg.
        return isinstance(error, psycopg.OperationalError)
    return state[:2] in UNANSWERED_CLASSES or state in UNANSWERED_STATES
