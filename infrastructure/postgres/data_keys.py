"""The data-key table: one AES key per session, tagged with its tenant and user.

``<schema>.data_keys`` (made by ``migrate``). Destroying a key sets it and the user tag to
NULL in the same transaction that drops the session's snapshots (sealed under that key),
and then ``VACUUM`` removes the old row versions from the table's pages; copies in WAL
and backups last as long as those are kept. An engine trusts a key it read for
``Settings.data_key_cache_s`` seconds: the bound for ``forget`` on other engines.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final
from uuid import UUID

from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import PostgresDatastore
from psycopg.sql import SQL, Composed, Identifier

from flowledger.infrastructure.sealing import DESTROYED, DataKey, Destroyed, KeyCache, new_data_key

TABLE: Final = "data_keys"
_log = logging.getLogger(__name__)


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
        self._vacuum = SQL("VACUUM {}").format(table)

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
        """Destroy the keys and user tags, drop the snapshots; then vacuum the old row versions away."""
        ids = list(stream_ids)
        with self._datastore.transaction(commit=True) as cur:
            cur.execute(self._destroy, (ids,))
            destroyed = cur.rowcount
            cur.execute(self._drop_snapshots, (ids,))
        for stream_id in ids:
            self._cache.put(stream_id, DESTROYED)
        self.vacuum()
        return destroyed

    def vacuum(self) -> None:
        """Remove dead row versions (the destroyed keys' old bytes) from the table's pages."""
        try:
            with self._datastore.get_connection() as conn:
                conn.execute(self._vacuum)  # the pool's connections are in autocommit
        except (PersistenceError, OSError) as error:  # the keys are destroyed either way
            _log.warning("VACUUM of the data-key table failed: %s", error)


def _key_of(row: Any) -> DataKey:
    if row is None:
        return None
    key = row["data_key"] if isinstance(row, dict) else row[0]
    return DESTROYED if key is None else bytes(key)


def _uuid(row: Any) -> UUID:
    value = row["stream_id"] if isinstance(row, dict) else row[0]
    return value if isinstance(value, UUID) else UUID(str(value))
