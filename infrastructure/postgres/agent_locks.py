"""Advisory locks on agents, so that assigners in different processes do not pick one agent.

Every assigner wants the least-loaded capable agent; engines that decide apart all pick the
same one and all but one lose the save. With these locks an engine's batch takes the locks
of the agents it means to use (``pg_try_advisory_xact_lock``, in order of preference, up to
as many as it needs, in one statement) and chooses among those; an agent another engine
holds is skipped for the next best. With each lock come the agent's stored events after
the version the engine knows (read by a second statement of the same round trip, so after
the lock is held: it sees the last holder's commit), so the batch decides on the agent as it
stands and its save does not lose on a stale version, and the audit chain learns the
stream's last hash without reading it again for the append.

The locks belong to a transaction on a connection of their own, and the batch's append is
made and committed in that same transaction (``transaction``): the commit releases them,
with no unlock round trip, and a failed or abandoned batch releases them by rolling back
(``end``). The locks are only ever an optimisation: the agents' versions keep capacity
whatever happens, so a lost connection (which frees its locks on the server), a timeout or
any other failure of the database to answer (``unanswered.py``) just means deciding without
them and saving through the pool: counted in ``fallbacks``, warned once per burst. A
statement the database refuses (a bug of ours) is raised, its transaction rolled back.
Behind PgBouncer in transaction mode locks taken outside the append's own round trip would
not hold, so none are taken there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg import sql

from flowledger.infrastructure.postgres.chain import StreamChain
from flowledger.infrastructure.postgres.deadlines import Deadlines
from flowledger.infrastructure.postgres.sql import advisory_key
from flowledger.infrastructure.postgres.unanswered import unanswered
from flowledger.infrastructure.postgres.watchdog import watching

IDLE_S = 5
"""Seconds the locks' transaction may sit idle before the server ends it (the library's default
for its own connections)."""

_IDLE = psycopg.pq.TransactionStatus.IDLE
_OPEN = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)

_log = logging.getLogger(__name__)


class AgentLocks:
    """Transaction-level advisory locks on agents (one connection, used by one thread at a time)."""

    def __init__(
        self,
        database_url: str,
        schema: str,
        events_table: str,
        deadlines: Deadlines,
        chain: StreamChain | None = None,
    ) -> None:
        self._url = database_url
        self._schema = schema
        self._deadlines = deadlines
        self._chain = chain
        self._conn: psycopg.Connection[Any] | None = None
        self.fallbacks = 0
        """Lock calls the database could not answer, decided without the locks (for tests and benches)."""
        self._falling_back = False
        self.streams: dict[UUID, list[StoredEvent]] = {}
        """Whole streams read with the locks (``try_lock(streams=…)``), oldest event first."""
        self.held: dict[UUID, list[StoredEvent] | None] = {}
        """Agents locked in the open transaction, each with its stored events after the
        version given when it was locked (None: unknown, read them)."""
        self.newer: dict[UUID, list[StoredEvent]] = {}
        """Every agent the last call asked about, taken or not, with its stored events after
        the version given (a stream's versions leave no gaps: a prefix of what comes next,
        however concurrent the writers), when there were any and the given version was
        found: what an engine's roster can catch up with, read anyway."""
        # A statement of its own after the locks: its snapshot is taken after they are held.
        # The row at the known version itself comes too, for its hash. Whole streams are
        # asked for in the same statement, from version 0 (``try_lock(streams=…)``).
        self._since = (
            sql.SQL(
                "SELECT a.i, e.originator_version, e.topic, e.state, e.event_hash, e.event_mac "
                "FROM unnest(%s::uuid[], %s::bigint[]) WITH ORDINALITY AS a(id, known, i) "
                "JOIN {}.{} e ON e.originator_id = a.id AND e.originator_version >= a.known "
                "ORDER BY a.i, e.originator_version"
            )
            .format(sql.Identifier(schema), sql.Identifier(events_table))
            .as_string(None)
        )

        # The locks and the read after them as one query string of two statements, values
        # written in (ints and uuids only): one round trip in the simple protocol, each
        # statement with its own snapshot, without psycopg's pipeline and parameter dumping
        # (a third of an 8-process assignment's client CPU went to ``try_lock`` that way).
        # The read's text around its two arrays, split once (the identifiers stay untouched).
        head, rest = self._since.split("%s::uuid[]", 1)
        middle, tail = rest.split("%s::bigint[]", 1)
        self._since_parts = (head + "'{", "}'::uuid[]" + middle + "'{", "}'::bigint[]" + tail)

    def _since_text(self, ids: Sequence[UUID], known: Sequence[int]) -> str:
        """The read of the streams' events from the versions given, values written in."""
        head, middle, tail = self._since_parts
        return (
            head
            + ",".join(str(UUID(str(stream))) for stream in ids)
            + middle
            + ",".join(str(int(version)) for version in known)
            + tail
        )

    def key(self, agent_id: UUID) -> int:
        """The lock's 64-bit key: the schema and the agent (agents of two schemas never share one)."""
        return advisory_key(f"{self._schema}\x1f{agent_id}")

    def try_lock(
        self, ranked: Sequence[tuple[UUID, int]], wanted: int = 1, *, streams: Sequence[UUID] = ()
    ) -> tuple[list[UUID], set[UUID]]:
        """Take up to ``wanted`` of the agents' locks (agent, version known), trying them in
        the order given, in one round trip: returns those taken (their newer events in
        ``held``) and those found held elsewhere; ``streams`` are read whole in the same
        round trip (into ``streams``: the batch's tasks this engine has not seen). When the
        database cannot answer (``unanswered``), the first ``wanted`` count as taken, events
        unknown (deciding without locks is safe, only slower); any other psycopg error is raised."""
        self.newer.clear()
        candidates = [(agent, known) for agent, known in ranked if agent not in self.held]
        if not candidates or wanted < 1:
            return [], set()
        keys = ",".join(str(self.key(a)) for a, _ in candidates)
        # Rows are filtered one at a time in array order and the LIMIT stops the scan, so the
        # function runs (and a lock is taken) only until enough were taken.
        query = (
            f"SELECT c.i FROM unnest('{{{keys}}}'::bigint[]) WITH ORDINALITY AS c(k, i) "
            f"WHERE pg_try_advisory_xact_lock(c.k) LIMIT {int(wanted)}; "
        ) + self._since_text(
            [*(a for a, _ in candidates), *streams], [*(k for _, k in candidates), *[0] * len(streams)]
        )
        try:
            conn = self._connection()
            begin = "BEGIN; " if conn.pgconn.transaction_status == _IDLE else ""
            with watching(conn), conn.cursor() as curs:
                curs.execute(begin + query, prepare=False)
                if begin:
                    curs.nextset()
                taken = [int(row[0]) - 1 for row in curs.fetchall()]
                curs.nextset()
                rows = curs.fetchall()
        except psycopg.Error as error:
            self._fall_back(error)
            guessed = [agent for agent, _ in candidates[:wanted]]
            self.held.update(dict.fromkeys(guessed))
            return guessed, set()
        self._answered()
        first_stream = len(candidates) + 1
        split = next((n for n, row in enumerate(rows) if row[0] >= first_stream), len(rows))
        self._keep_streams([(streams[row[0] - first_stream], *row[1:]) for row in rows[split:]])
        rows = self._unaltered(rows[:split], [agent for agent, _ in candidates])
        self._hold(candidates, taken, rows)
        # Every candidate before the last one taken was tried; all were, if too few were taken.
        tried = len(candidates) if len(taken) < wanted else max(taken) + 1
        return [candidates[n][0] for n in taken], {a for a, _ in candidates[:tried] if a not in self.held}

    def lock(self, agent_id: UUID, known: int) -> None:
        """Wait for the agent's lock (bounded by the statement timeout and the operation's deadline);
        its newer events go in ``held`` (and ``newer``); unknown when the database cannot answer,
        as in ``try_lock``."""
        self.newer.clear()
        try:
            conn = self._connection()
            query = f"SELECT pg_advisory_xact_lock({self.key(agent_id)}); " + self._since_text(
                [agent_id], [known]
            )
            begin = "BEGIN; " if conn.pgconn.transaction_status == _IDLE else ""
            with watching(conn), conn.cursor() as curs:
                curs.execute(begin + query, prepare=False)
                for _ in range(2 if begin else 1):  # BEGIN's result, then the lock's
                    curs.nextset()
                rows = curs.fetchall()
        except psycopg.Error as error:
            self._fall_back(error)
            self.held[agent_id] = None
            return
        self._answered()
        self._hold([(agent_id, known)], [0], self._unaltered(rows, [agent_id]))

    def _fall_back(self, error: psycopg.Error) -> None:
        """Go on without the locks when the database could not answer; raise anything else,
        with no lock left behind (the failed statement may have taken some before it failed)."""
        if not unanswered(error):
            self.end()
            raise error
        self.close()
        self.fallbacks += 1
        if not self._falling_back:  # one warning for an outage, not one per batch
            self._falling_back = True
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            _log.warning("agent locks unavailable, deciding without them until they answer: %s", detail)

    def _answered(self) -> None:
        if self._falling_back:
            self._falling_back = False
            _log.info("agent locks answer again")

    def _unaltered(self, rows: list[Any], by_index: Sequence[UUID] | None = None) -> list[Any]:
        """``rows`` (stream, or its 1-based index in ``by_index``; version, topic, state, hash,
        seal; by stream and version) less every stream with a row the chain refuses
        (``StreamChain.altered``): the task streams read with the locks were decoded and adopted
        unchecked, so a task whose description was edited in the database was assigned as
        edited, though ``get_task`` refused it. A stream left out is read as usual (an agent's,
        in full), and refused there."""
        if self._chain is None or not rows:
            return rows
        keys = ("originator_id", "originator_version", "topic", "state", "event_hash", "event_mac")
        checked = [
            dict(zip(keys, (row[0] if by_index is None else by_index[row[0] - 1], *row[1:]), strict=True))
            for row in rows
        ]
        altered = self._chain.altered(checked)
        if not altered:
            return rows
        return [row for row, seen in zip(rows, checked, strict=True) if seen["originator_id"] not in altered]

    def _keep_streams(self, rows: list[Any]) -> None:
        rows = self._unaltered(rows)
        for stream, version, topic, state, _hashed, _sealed in rows:
            self.streams.setdefault(stream, []).append(
                StoredEvent(originator_id=stream, originator_version=version, topic=topic, state=bytes(state))
            )
        self._note_heads(rows)

    def _note_heads(self, rows: list[Any]) -> None:
        if self._chain is None:
            return
        for n, row in enumerate(rows):
            last_of_stream = n + 1 == len(rows) or rows[n + 1][0] != row[0]
            if last_of_stream and row[4] is not None:
                self._chain.note_head(row[0], row[1], bytes(row[4]))

    def _hold(self, candidates: list[tuple[UUID, int]], taken: list[int], rows: list[Any]) -> None:
        found: dict[int, list[Any]] = {}
        for row in rows:
            found.setdefault(int(row[0]) - 1, []).append(row)
        for n, stream in found.items():
            agent, known = candidates[n]
            if len(stream) > 1 and stream[0][1] == known:
                self.newer[agent] = [
                    StoredEvent(originator_id=agent, originator_version=v, topic=t, state=bytes(state))
                    for _, v, t, state, _, _ in stream[1:]
                ]
        for n in taken:
            agent, known = candidates[n]
            stream = found.get(n, [])
            if not stream or stream[0][1] != known:  # the known version is not stored: read it all
                self.held[agent] = None
                continue
            self.held[agent] = self.newer.get(agent, [])
            last = stream[-1]
            if self._chain is not None and last[4] is not None:
                self._chain.note_head(agent, last[1], bytes(last[4]))

    @property
    def transaction(self) -> psycopg.Connection[Any] | None:
        """The open transaction holding the locks, for the batch's append to commit; None when
        no lock is held there (none taken, or the connection was lost)."""
        conn = self._conn
        if conn is None or conn.closed or conn.info.transaction_status not in _OPEN:
            return None
        return conn

    def end(self) -> None:
        """Release every lock: roll back the transaction if nobody committed it."""
        self.held.clear()
        self.newer.clear()
        self.streams.clear()
        conn = self._conn
        if conn is None or conn.closed or conn.info.transaction_status not in _OPEN:
            return
        try:
            with watching(conn):
                conn.rollback()
        except psycopg.Error:
            # Whatever the rollback met (it runs no statement of ours that could be wrong),
            # closing is the cleanup: the server frees a closed session's locks.
            self.close()

    def close(self) -> None:
        """Close the connection (its locks go with it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            kwargs = self._deadlines.connection_kwargs()
            # A process that stalls while holding locks loses them (and its session) on the
            # server instead of holding every other engine back.
            kwargs["options"] = (
                f"{kwargs.get('options', '')} -c idle_in_transaction_session_timeout={IDLE_S * 1000}"
            )
            # Autocommit, and each transaction begun by hand in the first query that needs it:
            # psycopg would send its own BEGIN ahead of a query, a round trip of its own
            # outside a pipeline. ``commit`` and ``rollback`` still end the open transaction.
            self._conn = psycopg.connect(self._url, autocommit=True, **kwargs)
        return self._conn
