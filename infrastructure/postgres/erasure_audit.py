"""Data keys destroyed without an erasure on record (``flowledger audit verify``; docs/erasure.md).

A session whose personal fields are sealed reads them as erased once its data key is gone.
``forget`` records ``DataErased`` before it destroys the key; a key set to NULL (or its row
deleted) by SQL erased a session's inputs and outputs with no event, and ``audit verify``
said ok: every row still hashed as written, and ``get_session`` read ``erased`` as false.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.utils import get_topic
from psycopg.sql import SQL, Composed, Identifier

from flowledger.domain.session import Session
from flowledger.infrastructure.postgres.data_keys import TABLE

_UNRECORDED = """
SELECT e.originator_id, bool_or(k.stream_id IS NULL) FROM {events} e
LEFT JOIN {keys} k ON k.stream_id = e.originator_id
WHERE (k.stream_id IS NULL OR k.data_key IS NULL) {one}
AND position('"_sealed":"'::bytea IN e.state) > 0 AND position('"_sealed":""'::bytea IN e.state) = 0
AND NOT EXISTS (SELECT 1 FROM {events} d WHERE d.originator_id = e.originator_id AND d.topic = %(erased)s)
GROUP BY e.originator_id ORDER BY e.originator_id
"""


def unrecorded_erasures(
    conn: psycopg.Connection[Any], schema: str, events_table: str, stream: UUID | None = None
) -> list[str]:
    """One line per stream (or ``stream`` alone) holding sealed fields whose data key is gone
    with no ``DataErased`` among its events; none when there is no key table."""
    found = conn.execute("SELECT to_regclass(%s)", [Identifier(schema, TABLE).as_string(conn)]).fetchone()
    if not (found and found[0]):
        return []
    one: Composed | SQL = SQL("AND e.originator_id = %(stream)s") if stream is not None else SQL("")
    statement = SQL(_UNRECORDED).format(
        events=Identifier(schema, events_table), keys=Identifier(schema, TABLE), one=one
    )
    rows = conn.execute(statement, {"erased": get_topic(Session.DataErased), "stream": stream}).fetchall()
    return [
        f"data key of stream {stream_id}: {'deleted' if deleted else 'destroyed'} in the database with no"
        " erasure on record (no DataErased event): its sealed personal fields read as erased"
        for stream_id, deleted in rows
    ]
