"""The data-key table: one AES key per session, tagged with its tenant and user.

``<schema>.data_keys`` (made by ``migrate``). Destroying a key sets it and the user tag to
NULL in the same transaction that drops the session's snapshots (sealed under that key).
The UPDATE leaves the old row version, key bytes and user id, in the table's pages (and the
user id in its index), readable with ``pageinspect`` or from the table's file, until a vacuum
removes it; and a plain ``VACUUM`` removes the version but leaves its bytes in the page's free
space until something is written over them. So ``destroy`` waits (within a bound) until no
transaction can still see the old version, then rewrites the table and its indexes
(``VACUUM FULL``, a short exclusive lock: the table holds one small row per session); copies
in WAL and backups last as long as those are kept. An engine trusts a key it read for
``Settings.data_key_cache_s`` seconds: the bound for ``forget`` on other engines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Final
from uuid import UUID

import psycopg
from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import PostgresDatastore
from psycopg.sql import SQL, Composed, Identifier

from flowledger.infrastructure.sealing import DESTROYED, DataKey, Destroyed, KeyCache, new_data_key

TABLE: Final = "data_keys"
_log = logging.getLogger(__name__)

_HOLDERS = """
SELECT count(*) FROM (
    SELECT backend_xmin AS x FROM pg_stat_activity WHERE pid <> pg_backend_pid()
        AND (datname = current_database() OR backend_type = 'walsender')
    UNION ALL SELECT backend_xid FROM pg_stat_activity WHERE pid <> pg_backend_pid()
    UNION ALL SELECT xmin FROM pg_replication_slots
    UNION ALL SELECT transaction FROM pg_prepared_xacts
) h WHERE x IS NOT NULL AND age(x) >= age(%s::text::xid)
"""
"""How many transactions (and slots) may still see row versions that transaction ``%s`` (an
xid, as text) deleted: while any does, no vacuum can remove those versions. A transaction
holding an xid counts in any database of the server: every snapshot taken while it runs, the
rewrite's own included, starts at it, so the rewrite kept the old version (a forget beside an
open write in another database reported a clean erasure and left the key in the file); a
reader of another database (an xmin, no xid) holds nothing here."""
PURGE_WAIT_S: Final = 30.0
"""How long ``destroy`` waits for the transactions that can still see a destroyed key's old
row version to end, before it rewrites the table anyway (and says the old version remains)."""
_LOCK_TIMEOUT = "SET lock_timeout = '2s'"
"""The rewrite waits this long for its exclusive lock, so that it never queues every key read
and session start behind a long reader of the table; it is tried again within the wait."""


def create_table(schema: str) -> list[Composed]:
    """The key table and its user index (``migrate`` runs these)."""
    s, t = Identifier(schema), Identifier(TABLE)
    return [
        SQL(
            "CREATE TABLE IF NOT EXISTS {s}.{t} ("
            "stream_id uuid PRIMARY KEY, "
            "tenant text, "
            "user_id text, "
            "data_key bytea, "
            "created_at timestamptz NOT NULL DEFAULT now(), "
            "destroyed_at timestamptz)"
        ).format(s=s, t=t),
        SQL("CREATE INDEX IF NOT EXISTS {i} ON {s}.{t} (tenant, user_id) WHERE user_id IS NOT NULL").format(
            i=Identifier(f"{TABLE}_user_idx"), s=s, t=t
        ),
    ]


class PostgresDataKeys:
    """Data keys in ``<schema>.data_keys``, read through the event store's pool."""

    def __init__(
        self, datastore: PostgresDatastore, schema: str, snapshots_table: str, cache_ttl_s: float
    ) -> None:
        self._datastore = datastore
        self._cache = KeyCache(cache_ttl_s)
        table = SQL("{}.{}").format(Identifier(schema), Identifier(TABLE))
        self._table = table
        self._select = SQL("SELECT data_key, destroyed_at FROM {} WHERE stream_id = %s").format(table)
        # One statement, one round trip (the pool's connections are in autocommit), and no WAL
        # flush of its own: the session's first append commits after it and flushes the WAL
        # through it; a key whose append never happens protects nothing.
        self._insert = SQL(
            "WITH no_flush AS (SELECT set_config('synchronous_commit', 'off', true)) "
            "INSERT INTO {} (stream_id, tenant, user_id, data_key) SELECT %s, %s, %s, %s FROM no_flush "
            "ON CONFLICT (stream_id) DO NOTHING"
        ).format(table)
        self._tag = SQL(
            "WITH no_flush AS (SELECT set_config('synchronous_commit', 'off', true)) "
            "UPDATE {} SET user_id = %s FROM no_flush "
            "WHERE stream_id = %s AND user_id IS NULL AND data_key IS NOT NULL"
        ).format(table)
        self._tagged: set[UUID] = set()
        """Streams whose key is known to carry a user (made with one, or tagged here)."""
        self._streams = SQL(
            "SELECT stream_id FROM {} WHERE tenant = %s AND user_id = %s AND data_key IS NOT NULL "
            "ORDER BY created_at"
        ).format(table)
        self._destroy = SQL(
            "UPDATE {} SET data_key = NULL, user_id = NULL, destroyed_at = now() "
            "WHERE stream_id = ANY(%s) AND data_key IS NOT NULL"
        ).format(table)
        self._drop_snapshots = SQL("DELETE FROM {}.{} WHERE originator_id = ANY(%s)").format(
            Identifier(schema), Identifier(snapshots_table)
        )
        self._vacuum = SQL("VACUUM FULL {}").format(table)
        self.purge_wait_s = PURGE_WAIT_S
        self._replaced_by: str | None = None
        """The (32-bit) id of the last transaction that destroyed keys, until ``purge``."""

    def key_of(self, stream_id: UUID) -> DataKey:
        """The stream's key (cached), DESTROYED, or None."""
        held, key = self._cache.get(stream_id)
        if held:
            return key
        with self._datastore.get_connection() as conn:
            row = conn.execute(self._select, (stream_id,)).fetchone()
        key = _key_of(row)
        self._cache.put(stream_id, key)
        return key

    def create(self, stream_id: UUID, tenant: str, user_id: str | None) -> bytes | Destroyed:
        """The stream's key, made now unless it exists (then the first one stands)."""
        held, key = self._cache.get(stream_id)
        if held and key is not None:
            return key
        fresh = new_data_key()
        with self._datastore.get_connection() as conn:
            inserted = conn.execute(self._insert, (stream_id, tenant, user_id, fresh)).rowcount == 1
            row = None if inserted else conn.execute(self._select, (stream_id,)).fetchone()
        key = fresh if inserted else _key_of(row)
        if user_id is not None:
            self._remember_tagged(stream_id)
        if key is None:  # cannot happen: the row exists
            key = DESTROYED
        self._cache.put(stream_id, key)
        return key

    def tag(self, stream_id: UUID, user_id: str) -> None:
        """Tag the stream's live key with ``user_id`` unless it carries a user already."""
        if stream_id in self._tagged:
            return
        with self._datastore.get_connection() as conn:
            conn.execute(self._tag, (user_id, stream_id))
        self._remember_tagged(stream_id)

    def _remember_tagged(self, stream_id: UUID) -> None:
        if len(self._tagged) >= 100_000:
            self._tagged.clear()  # a forgotten entry costs one no-op UPDATE at a later restart
        self._tagged.add(stream_id)

    def streams_of(self, tenant: str, user_id: str) -> list[UUID]:
        """The streams whose live keys carry this user, oldest first."""
        with self._datastore.get_connection() as conn:
            rows = conn.execute(self._streams, (tenant, user_id)).fetchall()
        return [_uuid(row) for row in rows]

    def destroy(self, stream_ids: Sequence[UUID]) -> int:
        """Destroy the keys and user tags, drop the snapshots; ``purge`` then removes the old
        row versions from the table's files."""
        ids = list(stream_ids)
        with self._datastore.transaction(commit=True) as cur:
            cur.execute(self._destroy, (ids,))
            destroyed = cur.rowcount
            cur.execute(self._drop_snapshots, (ids,))
            row = cur.execute("SELECT (txid_current() % 4294967296)::text AS xid").fetchone()
        for stream_id in ids:
            self._cache.put(stream_id, DESTROYED)
        if destroyed:
            self._replaced_by = row["xid"] if isinstance(row, dict) else row[0] if row else None
        return destroyed

    def purge(self) -> bool:
        """Remove the row versions the last ``destroy`` replaced from the table's files: wait
        until no transaction can still see them, then rewrite the table (and its indexes). False,
        with a warning logged, when one may remain (a reader older than the destruction outlived
        ``purge_wait_s``, or the rewrite failed: an operator's ``VACUUM FULL`` of the table, once
        that reader ended, removes it)."""
        xid, self._replaced_by = self._replaced_by, None
        deadline = time.monotonic() + self.purge_wait_s
        try:
            with self._datastore.get_connection() as conn:  # the pool's connections are in autocommit
                seen = xid is None or self._wait_for_readers(conn, xid, deadline)
                conn.execute(_LOCK_TIMEOUT)
                try:
                    while True:
                        try:
                            conn.execute(self._vacuum)
                            break
                        except psycopg.errors.LockNotAvailable:
                            if time.monotonic() >= deadline:
                                raise
                            time.sleep(0.1)
                    # Readers that began before the destruction and ended during the rewrite had
                    # kept the old version in the new file: rewrite again once they are gone.
                    if not seen and xid is not None and self._wait_for_readers(conn, xid, time.monotonic()):
                        conn.execute(self._vacuum)
                        seen = True
                finally:
                    conn.execute("RESET lock_timeout")
        except (PersistenceError, OSError, psycopg.Error) as error:  # the keys are destroyed either way
            _log.warning(
                "the destroyed data keys' old row versions may remain in the key table's file: its"
                " rewrite (VACUUM FULL) failed: %s",
                error,
            )
            return False
        if not seen:
            _log.warning(
                "the destroyed data keys' old row versions remain in the key table's file: a"
                " transaction begun before the erasure was still open after %g s; VACUUM FULL %s"
                " once it ends",
                self.purge_wait_s,
                self._table.as_string(None),
            )
        return seen

    @staticmethod
    def _wait_for_readers(conn: Any, xid: str, deadline: float) -> bool:
        """True once no transaction (nor slot) can see what ``xid`` replaced; False at ``deadline``."""
        delay = 0.01
        while True:
            row = conn.execute(_HOLDERS, (xid,)).fetchone()
            held = row["count"] if isinstance(row, dict) else row[0]
            if not held:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _key_of(row: Any) -> DataKey:
    if row is None:
        return None
    key = row["data_key"] if isinstance(row, dict) else row[0]
    return DESTROYED if key is None else bytes(key)


def _uuid(row: Any) -> UUID:
    value = row["stream_id"] if isinstance(row, dict) else row[0]
    return value if isinstance(value, UUID) else UUID(str(value))
