"""Advisory locks on tasks being classified, so that engines in different processes pay for one
model call per task, not one each.

An engine about to classify a task (``TaskClassifier``) takes the task's lock with
``pg_try_advisory_lock`` and holds it through the model call and the save; an engine that
finds it held waits (polling, up to a bound) and then reads the task again, which the first
has classified by then: it answers from the task, with no call. A ``reclassify`` takes a lock
of its own per task and model (the purpose names them), so that only a reclassify on the same
model waits for it and takes the outcome recorded meanwhile as its own. A model-ranked
assignment takes the task's ``rank`` lock through its tie-break call and the assignment
(``engine/ranking.py``), so that another engine's finds the task taken. The locks are session-level
and live on one autocommit connection of their own (no transaction is held open during a
call), shared by the engine's classifications under a thread lock: each statement is one
short round trip. They are only ever an optimisation: a lost connection frees its locks on
the server, and a caller that cannot take or reach the lock classifies anyway, as before
(the answer that comes second is recorded as ``ClassificationDiscarded``, paid). Behind
PgBouncer in transaction mode a session lock would not hold, so none are taken there.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from uuid import UUID

import psycopg

from flowledger.infrastructure.postgres.deadlines import Deadlines
from flowledger.infrastructure.postgres.sql import advisory_key
from flowledger.infrastructure.postgres.watchdog import watching


class ClassificationLocks:
    """Session-level advisory locks on tasks (one connection, shared under a thread lock)."""

    def __init__(self, database_url: str, schema: str, deadlines: Deadlines) -> None:
        self._url = database_url
        self._schema = schema
        self._deadlines = deadlines
        self._conn: psycopg.Connection[Any] | None = None
        self._guard = threading.Lock()

    def key(self, task_id: UUID, purpose: str = "classify") -> int:
        """The lock's 64-bit key: the schema, the purpose and the task (never an agent's key)."""
        return advisory_key(f"{self._schema}\x1f{purpose}\x1f{task_id}")

    def try_lock(self, task_id: UUID, purpose: str = "classify") -> bool | None:
        """Take the task's lock for ``purpose``: True when taken, False when another session
        holds it, None when the database could not be asked (classify without it)."""
        row = self._run(f"SELECT pg_try_advisory_lock({self.key(task_id, purpose)})")
        return None if row is None else bool(row[0])

    def unlock(self, task_id: UUID, purpose: str = "classify") -> None:
        """Let the task's lock for ``purpose`` go (a lost connection has let it go already)."""
        self._run(f"SELECT pg_advisory_unlock({self.key(task_id, purpose)})")

    def close(self) -> None:
        """Close the connection (its locks go with it)."""
        with self._guard:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _run(self, query: str) -> tuple[Any, ...] | None:
        with self._guard:
            try:
                conn = self._connection()
                with watching(conn, time.monotonic() + self._deadlines.operation_s), conn.cursor() as curs:
                    curs.execute(query, prepare=False)
                    return curs.fetchone()
            except psycopg.Error:
                lost, self._conn = self._conn, None
                if lost is not None:
                    lost.close()  # the server frees a closed session's locks
                return None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._url, autocommit=True, **self._deadlines.connection_kwargs())
        return self._conn
