"""An engine seals with the chain key its log is sealed with, or does not start (docs/audit.md).

An engine on a host whose key directory was not copied from the writers' (or given another
installation's ``FLOWLEDGER_CHAIN_KEY``) made a key of its own at start; then every read it
served was ``StoredEventAltered`` (HTTP 500), and what it wrote was sealed under its key, so
that the writers read those sessions as altered and ``audit verify`` called them forged. At
start, before any key is made, the newest sealed rows are read (one indexed query): where
there are some, the key must exist already (none is made) and seal at least one of them.
One altered row among them does not stop the writers starting: a read of it still refuses it.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from eventsourcing.postgres import PostgresDatastore
from psycopg import Connection
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.audit_keys import CHAIN_KEY_FILE, chain_key
from flowledger.infrastructure.settings import Settings
from flowledger.verify import MacKey

_log = logging.getLogger(__name__)

NEWEST = 16
"""How many of the newest sealed rows are read at start."""

_ENGINE = (
    "an engine on a log already sealed seals with the writers' key"
    " (FLOWLEDGER_CHAIN_KEY_REPLACED=1 if it is lost for good)"
)

Seal = tuple[Any, int, bytes, bytes]
"""A sealed row: stream id, version, ``event_hash``, ``event_mac``."""


LOOKED_AT = 1_000
"""How many of the newest rows are looked at for seals: a log whose last thousand rows were
written with the chain off is taken as not sealed (no full scan at every start)."""


def newest_seals(conn: Connection[Any], schema: str, table: str, limit: int = NEWEST) -> list[Seal]:
    """The ``limit`` newest rows of the events table that carry a seal, among its ``LOOKED_AT``
    newest rows, newest first."""
    statement = SQL(
        "SELECT originator_id, originator_version, event_hash, event_mac FROM"
        " (SELECT originator_id, originator_version, event_hash, event_mac, notification_id FROM {}"
        " ORDER BY notification_id DESC LIMIT %s) AS newest"
        " WHERE event_mac IS NOT NULL AND event_hash IS NOT NULL ORDER BY notification_id DESC LIMIT %s"
    ).format(Identifier(schema, table))
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(statement, [LOOKED_AT, limit]).fetchall()
    return [(row[0], int(row[1]), bytes(row[2]), bytes(row[3])) for row in rows]


def checked_chain_key(datastore: PostgresDatastore, table: str, settings: Settings) -> bytes:
    """``writers_chain_key`` of the events table ``table`` (a connection of the store's pool)."""
    table = table.rsplit(".", 1)[-1]
    with datastore.get_connection() as conn:
        seals = newest_seals(conn, datastore.schema, table)
    return writers_chain_key(settings, seals, f"{datastore.schema}.{table}")


def writers_chain_key(settings: Settings, seals: list[Seal], where: str) -> bytes:
    """The chain key to seal with: on a log no row of which is sealed yet, this host's (made on
    first use); else the one that seals at least one of ``seals`` (the newest sealed rows of
    ``where``), never a new one: a ValidationError on ``FLOWLEDGER_CHAIN_KEY`` otherwise."""
    if not seals:
        return chain_key(settings)
    if settings.chain_key_replaced:  # the writers' key is lost for good: the operator said so
        key = chain_key(settings)
        _log.warning(
            "chain key replaced (FLOWLEDGER_CHAIN_KEY_REPLACED): %s is sealed under another key; its"
            " older rows will read as altered and audit verify will call them forged",
            where,
        )
        return key
    key = chain_key(settings, make=False, reader=_ENGINE)
    mac = MacKey(key)
    if any(
        hmac.compare_digest(mac.mac(str(s), version, chained), sealed)
        for s, version, chained, sealed in seals
    ):
        return key
    given = (
        "FLOWLEDGER_CHAIN_KEY" if settings.chain_key is not None else str(settings.key_dir / CHAIN_KEY_FILE)
    )
    raise ValidationError(
        "FLOWLEDGER_CHAIN_KEY",
        f"this engine's chain key ({given}) is not the key the log was sealed with: none of the"
        f" {len(seals)} newest sealed events of {where} checks under it. Use the writers' (copy their"
        " key directory, or set FLOWLEDGER_CHAIN_KEY); if it is theirs, those rows were altered in"
        " the database (`flowledger audit verify` names them); if theirs is lost for good,"
        " FLOWLEDGER_CHAIN_KEY_REPLACED=1 starts with this one",
    )
