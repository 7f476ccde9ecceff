"""The audit chain at write time: each appended event's hash and keyed seal (docs/audit.md).

An event's hash covers the hash of the event before it in its stream, so an append needs
that one. It never changes once written, so each stream's last hash is remembered here
after a commit; on a miss (another process wrote the stream, or this one restarted) it is
read in the append's own round of statements, before the append function runs (a read
does not take a transaction id, so the append stays its transaction's first write). The
version key of the events table still decides races: an append built on a stale version
fails as it always did.

A stream archived by retention has no rows before its first new event: its predecessor's
hash is the head its base keeps (``retention.py``).

A predecessor stored without a hash (a log from before the chain, not yet upgraded by
``flowledger audit chain``) is chained here from the stream's first unchained event, the
same way the upgrade will store it, so the two agree.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from psycopg import Cursor
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventAltered
from flowledger.infrastructure.postgres.retention import bases_table_name, head_of_base_sql
from flowledger.verify import GENESIS, MacKey, event_hash

Heads = dict[Any, tuple[int, bytes]]


class StreamChain:
    """Computes the hash and seal of every event an append writes; remembers stream heads."""

    def __init__(self, key: bytes, *, schema: str, table: str, max_streams: int = 100_000) -> None:
        self._key = MacKey(key)
        self._heads: Heads = {}
        self._max = max_streams
        self._lock = threading.Lock()
        self.appended = 0
        """Events this process appended and committed (the checkpointer counts them)."""
        target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
        self.sql_previous = (
            SQL("SELECT event_hash FROM {} WHERE originator_id = %s AND originator_version = %s")
            .format(target)
            .as_string(None)
        )
        self.sql_base = head_of_base_sql(schema)
        self.base_table = bases_table_name(schema)
        self.sql_prefix = (
            SQL(
                "SELECT originator_version, topic, state, event_hash FROM {} "
                "WHERE originator_id = %s AND originator_version < %s ORDER BY originator_version"
            )
            .format(target)
            .as_string(None)
        )

    def seal(
        self, curs: Cursor[Any], events: Sequence[StoredEvent], prepare: bool | None
    ) -> tuple[list[bytes], list[bytes], Heads]:
        """The hashes and seals of ``events`` (in order), and the heads they leave behind."""
        hashes: list[bytes] = []
        macs: list[bytes] = []
        heads: Heads = {}
        key = self._key
        for e in events:
            stream, version = e.originator_id, e.originator_version
            # (This append's own heads looked in only once it has some: a UUID's hash runs in
            # Python, and an append usually writes one event.)
            known = heads.get(stream) if heads else None
            if known is None:
                known = self._heads.get(stream)
            if version == 1:
                previous = GENESIS
            elif known is not None and known[0] == version - 1:
                previous = known[1]
            else:
                previous = self._read_previous(curs, stream, version, prepare)
            name = str(stream)
            chained = event_hash(previous, name, version, e.topic, e.state)
            hashes.append(chained)
            macs.append(key.mac(name, version, chained))
            heads[stream] = (version, chained)
        return hashes, macs, heads

    def altered(self, rows: Sequence[Any]) -> dict[Any, StoredEventAltered]:
        """The first row of each stream among ``rows`` (dict rows, by stream then version) that a
        read of the log refuses to serve: its content is not what its stored hash was taken over
        after the row before it; or its hash, where no later row read links to it, is not sealed
        under the chain key (an edit re-hashed by the public rule, a row inserted); or it has no
        hash after a row that has one.

        ``get_session`` and ``history`` answered a cost edited in the database (0.000197 ->
        0.000001) until ``audit verify`` next ran, and so an edit re-hashed to the stream's end.
        One SHA-256 per row and one HMAC per stream read, no statement more: each row's hash
        is linked to the next one's, so the newest row's seal vouches for every hash before it.
        Not judged here: rows before the first hash (a log from before the chain), the content
        of a row whose predecessor was not read with it (an archived stream's first, the oldest
        of a read from the newest down), rows deleted from the end: ``audit verify`` is."""
        found: dict[Any, StoredEventAltered] = {}
        last = len(rows) - 1
        name = ""
        start = 0
        for i, row in enumerate(rows):
            stream, version, stored = row["originator_id"], row["originator_version"], row["event_hash"]
            if stream in found:
                continue
            before = rows[i - 1] if i else None
            linked = before is not None and before["originator_id"] == stream
            if not linked:
                name = str(stream)
            linked = linked and before is not None and before["originator_version"] == version - 1
            if stored is None:
                if linked and before is not None and before["event_hash"] is not None:
                    found[stream] = StoredEventAltered(name, version, read=True, why="unhashed")
                continue
            if not linked or before is None or before["event_hash"] is None:
                start = i  # a run of rows each linked to the one before
            chained = bytes(stored)
            previous = GENESIS if version == 1 else bytes(before["event_hash"]) if linked and before else None
            if previous is not None:
                state = row["state"]
                state = b"" if state is None else bytes(state)
                if event_hash(previous, name, version, row["topic"] or "", state) != chained:
                    found[stream] = StoredEventAltered(name, version, read=True)
                    continue
            after = rows[i + 1] if i < last else None
            vouched = (
                after is not None
                and after["originator_id"] == stream
                and after["originator_version"] == version + 1
                and after["event_hash"] is not None
            )
            if not vouched and not self._sealed(name, row):
                # Only now is each seal of the run checked, to name the first that fails
                first = next(r for r in rows[start : i + 1] if not self._sealed(name, r))
                found[stream] = StoredEventAltered(
                    name, first["originator_version"], read=True, why="unsealed"
                )
        return found

    def altered_alone(self, row: Any) -> StoredEventAltered | None:
        """``altered`` for one row read without its neighbours (a search of a stream), with its
        predecessor's stored hash as ``previous_hash``: its content and its own seal checked."""
        stored, version = row["event_hash"], row["originator_version"]
        name = str(row["originator_id"])
        previous = GENESIS if version == 1 else row["previous_hash"]
        if stored is None:
            return None if previous is None else StoredEventAltered(name, version, read=True, why="unhashed")
        state = b"" if row["state"] is None else bytes(row["state"])
        if previous is not None and event_hash(
            bytes(previous), name, version, row["topic"] or "", state
        ) != bytes(stored):
            return StoredEventAltered(name, version, read=True)
        if not self._sealed(name, row):
            return StoredEventAltered(name, version, read=True, why="unsealed")
        return None

    def _sealed(self, name: str, row: Any) -> bool:
        """Whether ``row``'s stored seal is its hash's under the chain key."""
        mac = row["event_mac"]
        chained = bytes(row["event_hash"])
        return mac is not None and self._key.mac(name, row["originator_version"], chained) == bytes(mac)

    def committed(self, heads: Heads, appended: int) -> None:
        """Remember the heads an append committed (the oldest remembered streams go first)."""
        with self._lock:
            self.appended += appended
            self._heads.update(heads)
            self._trim()

    def note_head(self, stream: Any, version: int, hashed: bytes) -> None:
        """Remember a stream's stored hash at ``version``, read by someone else (a committed row)."""
        with self._lock:
            known = self._heads.get(stream)
            if known is None or known[0] < version:
                self._heads[stream] = (version, hashed)
                self._trim()

    def _trim(self) -> None:
        """Forget the oldest remembered streams past ``max_streams`` (call holding the lock)."""
        while len(self._heads) > self._max:
            del self._heads[next(iter(self._heads))]

    def forget(self) -> None:
        """Drop every remembered head (after ``audit chain`` or a test that rewrites rows)."""
        with self._lock:
            self._heads.clear()

    def _read_previous(self, curs: Cursor[Any], stream: Any, version: int, prepare: bool | None) -> bytes:
        row = curs.execute(self.sql_previous, (stream, version - 1), prepare=prepare).fetchone()
        if row is None:
            # No predecessor row: the stream was archived (its base keeps the head), or the
            # version key rejects this append unless a row is missing (deleted); the verifier
            # names the gap either way.
            return self._base_head(curs, stream, version - 1, prepare) or GENESIS
        if row[0] is not None:
            return bytes(row[0])
        return chain_prefix(
            curs.execute(self.sql_prefix, (stream, version), prepare=prepare).fetchall(), stream
        )

    def _base_head(self, curs: Cursor[Any], stream: Any, version: int, prepare: bool | None) -> bytes | None:
        """The head hash an archived stream's base keeps at ``version`` (None: no such base)."""
        found = curs.execute("SELECT to_regclass(%s)", (self.base_table,), prepare=prepare).fetchone()
        if found is None or found[0] is None:
            return None
        row = curs.execute(self.sql_base, (stream, version), prepare=prepare).fetchone()
        return None if row is None else bytes(row[0])


def chain_prefix(rows: Sequence[Sequence[Any]], stream: Any) -> bytes:
    """The hash of the last of ``rows`` (version, topic, state, stored hash or None, oldest
    first): stored hashes are taken as they are, missing ones computed from the one before."""
    previous = GENESIS
    name = str(stream)
    for version, topic, state, stored in rows:
        previous = (
            bytes(stored) if stored is not None else event_hash(previous, name, version, topic, bytes(state))
        )
    return previous
