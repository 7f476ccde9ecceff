"""Event rows chained again after a test edited them, as an engine holding the chain key would
have stored them: every hash and seal of the stream recomputed (``infrastructure/postgres/chain.py``).

A read by an engine that chains refuses a row whose hash or seal does not check
(``StoredEventAltered``) before it decodes it; a test of what the decoder or the fold makes
of a damaged row chains the damage again, so that the read itself meets it."""

from __future__ import annotations

from uuid import UUID

import psycopg
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure.audit_keys import chain_key
from flowledger.infrastructure.settings import Settings
from flowledger.verify import GENESIS, event_hash, event_mac


def chained_again(database_url: str, schema: str, stream: UUID, settings: Settings) -> None:
    """Every row of ``stream`` hashed and sealed again under ``settings``' chain key."""
    key = chain_key(settings)
    table = Identifier(schema, "flowledger_events")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            SQL(
                "SELECT originator_version, topic, state FROM {} WHERE originator_id = %s"
                " ORDER BY originator_version"
            ).format(table),
            (stream,),
        ).fetchall()
        previous = GENESIS
        for version, topic, state in rows:
            previous = event_hash(previous, str(stream), version, topic or "", bytes(state or b""))
            conn.execute(
                SQL(
                    "UPDATE {} SET event_hash = %s, event_mac = %s WHERE originator_id = %s"
                    " AND originator_version = %s"
                ).format(table),
                (previous, event_mac(key, str(stream), version, previous), stream, version),
            )


def notification_ids(database_url: str, schema: str) -> list[int]:
    """The notification ids of ``schema``'s stored events, in order."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            SQL("SELECT notification_id FROM {}.flowledger_events ORDER BY notification_id").format(
                Identifier(schema)
            )
        ).fetchall()
    return [int(row[0]) for row in rows]
