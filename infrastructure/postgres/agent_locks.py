"""Advisory locks on agents, so that assigners in different processes do not pick one agent.

Every assigner wants the least-loaded capable agent; engines that decide apart all pick the
same one and all but one lose the save. With these locks an engine's batch try-locks the
agent it chose (``pg_try_advisory_lock``, session level, on a connection of its own), and if
another engine holds it, chooses the next best instead; holding the lock, it reads the
agent's events it has not seen, so its save does not lose on a stale version. The locks are
only ever an optimisation: the agents' versions keep capacity whatever happens, so a lost
connection (which frees its locks on the server) just means deciding without them.
Behind PgBouncer in transaction mode session locks do not hold, so none are taken there.
"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from flowledger.infrastructure.postgres.deadlines import Deadlines


class AgentLocks:
    """Session-level advisory locks on agents (one connection, used by one thread at a time)."""

    def __init__(self, database_url: str, schema: str, events_table: str, deadlines: Deadlines) -> None:
        self._url = database_url
        self._schema = schema
        self._deadlines = deadlines
        self._conn: psycopg.Connection[Any] | None = None
        # Sent with the lock in one pipeline (one round trip), as a statement of its own: its
        # snapshot is taken after the lock is held, so it sees the last holder's commit.
        self._last_version = (
            sql.SQL("SELECT max(originator_version) FROM {}.{} WHERE originator_id = %s")
            .format(sql.Identifier(schema), sql.Identifier(events_table))
            .as_string(None)
        )

    def key(self, agent_id: UUID) -> int:
        """The lock's 64-bit key: the schema and the agent (agents of two schemas never share one)."""
        digest = hashlib.blake2b(f"{self._schema}\x1f{agent_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def try_lock(self, agent_id: UUID) -> tuple[bool, int | None]:
        """Take the agent's lock if nobody holds it, with the agent's last stored version
        (True and None when the database cannot say)."""
        try:
            conn = self._connection()
            with conn.pipeline():
                locked = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key(agent_id),))
                version = conn.execute(self._last_version, (agent_id,))
            got, last = locked.fetchone(), version.fetchone()
        except psycopg.Error:
            self.close()
            return True, None
        return bool(got and got[0]), last[0] if last else None

    def lock(self, agent_id: UUID) -> None:
        """Wait for the agent's lock (bounded by the statement timeout)."""
        self._execute("SELECT pg_advisory_lock(%s)", (self.key(agent_id),))

    def release_all(self) -> None:
        """Release every lock this connection holds."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            self.close()  # the server frees a closed session's locks

    def close(self) -> None:
        """Close the connection (its locks go with it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._url, autocommit=True, **self._deadlines.connection_kwargs())
        return self._conn

    def _execute(self, statement: str, params: tuple[Any, ...]) -> Any:
        try:
            return self._connection().execute(statement, params).fetchone()
        except psycopg.Error:
            self.close()
            return None
