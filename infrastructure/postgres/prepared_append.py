"""The one-event append (the common save) sent through libpq's prepared-statement call.

A ``record_step`` with eight writers in one process is bound by that process's CPU (the
GIL), and psycopg's ``Cursor.execute`` (query conversion, parameter dumpers, result
loaders, its wait generator) is a large part of an append's client CPU: through the
recorder, chain included, 179 µs per one-event append through the cursor against 135 µs
through ``PGconn.exec_prepared`` (``bench/bench_append_call.py``). This sends the same
statement, on the same pooled connection, with the parameters already in PostgreSQL's
binary form; libpq releases the GIL while it waits, as psycopg does.

What does not change: the statement (the append function, one round trip, the
connection's autocommit is the commit), its errors (psycopg's exception classes, from the
result's SQLSTATE; a broken connection is an ``OperationalError``, as psycopg raises it),
and that nothing is prepared behind PgBouncer (the recorder sends those through psycopg).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any
from uuid import UUID

import psycopg
from psycopg import pq

_PREPARED = "_flowledger_prepared"
"""The connection attribute naming the statements prepared on it (they live as long as it)."""
_INT8 = struct.Struct("!q")
_FORMATS = [1, 1, 0, 1, 1, 1]  # uuid, int8, bytea and bytea in binary; the topic as text
_DONE = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_GONE = "26000"  # invalid_sql_statement_name: the statement was deallocated (DISCARD ALL)


class PreparedAppend:
    """``SELECT <schema>.<function>_one(...)`` as a prepared statement of each connection."""

    def __init__(self, qualified_function: str) -> None:
        """``qualified_function``: the one-event append function, quoted and schema-qualified."""
        self.sql = (
            f"SELECT {qualified_function}($1::uuid, $2::int8, $3::text, $4::bytea, $5::bytea, $6::bytea)"
        ).encode()
        self.name = b"flowledger_append_" + hashlib.blake2b(self.sql, digest_size=8).hexdigest().encode()

    def __call__(
        self,
        conn: psycopg.Connection[Any],
        stream: UUID,
        version: int,
        topic: str,
        state: bytes,
        hashed: bytes | None,
        mac: bytes | None,
    ) -> int:
        """Append one event on ``conn`` (autocommit: the call commits); its notification id.

        Raises psycopg's errors, as ``Cursor.execute`` would for the same statement.
        """
        # None is sent as NULL (psycopg's own calls do the same; its stubs do not say so).
        params: Any = [stream.bytes, _INT8.pack(version), topic.encode(), state, hashed, mac]
        result = self._execute(conn, params)
        if result.status not in _DONE:
            error = _error(conn, result)
            if error.sqlstate != _GONE:
                raise error
            _prepared(conn).discard(self.name)  # deallocated under us, so it never ran: once more
            result = self._execute(conn, params)
            if result.status not in _DONE:
                raise _error(conn, result)
        return int(_INT8.unpack(result.get_value(0, 0) or b"")[0])

    def _execute(self, conn: psycopg.Connection[Any], params: Any) -> pq.abc.PGresult:
        self._prepare(conn)
        return conn.pgconn.exec_prepared(self.name, params, param_formats=_FORMATS, result_format=1)

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        prepared = _prepared(conn)
        if self.name in prepared:
            return
        result = conn.pgconn.prepare(self.name, self.sql)
        if result.status not in _DONE:
            raise _error(conn, result)
        prepared.add(self.name)


def _prepared(conn: psycopg.Connection[Any]) -> set[bytes]:
    names: set[bytes] | None = getattr(conn, _PREPARED, None)
    if names is None:
        names = set()
        setattr(conn, _PREPARED, names)
    return names


def _error(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> psycopg.Error:
    """psycopg's exception for a failed result: a lost connection is an OperationalError."""
    if conn.pgconn.status != pq.ConnStatus.OK:
        message = pq.error_message(result) or pq.error_message(conn.pgconn)
        return psycopg.OperationalError(message or "the connection to the server was lost")
    return psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
