"""The record of rows found past the log's id sequence when it was set forward, for ``audit verify``.

A stored notification id beyond the sequence's last value is evidence: only an edit puts it
there (a row moved ahead by SQL), or a sequence set back by hand. ``repair_sequence_order`` sets
the sequence forward past it at every engine's start, which erased that evidence: a row moved
ahead with no checkpoint over it verified once an engine had started (``audit verify``'s own
start among them). The repair records each such row here first (stream, version, position and
the sequence's value then), and ``audit verify`` names every one still stored there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL, Composed, Identifier

RECORDED_AT_MOST = 1_000
"""Rows recorded per repair (the first past the sequence, in log order): a sequence set back far
on a large log would otherwise copy the log's tail into the record."""


def table_for(events: str) -> str:
    """The record's table beside the events table ``events`` (``flowledger_sequence_repairs``)."""
    return f"{events.removesuffix('_events')}_sequence_repairs"


def create_table(schema: str, events: str) -> Composed:
    """The record: one row per stored row found past the sequence, kept for good."""
    return SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} (repaired_at timestamptz NOT NULL DEFAULT now(), "
        "sequence_last bigint NOT NULL, notification_id bigint NOT NULL, originator_id text NOT NULL, "
        "originator_version bigint NOT NULL)"
    ).format(Identifier(schema), Identifier(table_for(events)))


def record(cur: psycopg.Cursor[Any], schema: str, events: str, last: int, *, taken: int | None = None) -> int:
    """Record the rows of ``schema.events`` stored past ``last`` (the sequence's last value), in
    the caller's transaction, before the sequence is set forward; how many were recorded.

    ``taken``: an id an append drew and found stored, recorded too (as past ``taken - 1``): a row
    moved to the id the sequence hands out next is no longer past it once an append drew it."""
    found = cur.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table_for(events)}"',)).fetchone()
    if found is None or found[0] is None:  # a log made without ``migrate`` (a recorder built by hand)
        cur.execute(create_table(schema, events))
    cur.execute(
        SQL(
            "INSERT INTO {s}.{r} (sequence_last, notification_id, originator_id, originator_version) "
            "SELECT CASE WHEN notification_id = %s THEN notification_id - 1 ELSE %s END, notification_id,"
            " originator_id::text, originator_version FROM {s}.{e} "
            "WHERE notification_id > %s OR notification_id = %s ORDER BY notification_id LIMIT %s"
        ).format(s=Identifier(schema), r=Identifier(table_for(events)), e=Identifier(events)),
        (taken, last, last, taken, RECORDED_AT_MOST),
    )
    return cur.rowcount


@dataclass(frozen=True)
class RecordedMove:
    """A row recorded past the sequence and still stored where it was found."""

    stream: UUID
    version: int
    position: int
    sequence_last: int
    repaired_at: datetime

    def describe(self) -> str:
        """What ``audit verify`` says after the stream and version."""
        return (
            f"moved rows: its log position {self.position:,} lay past the last one the log's sequence"
            f" had issued ({self.sequence_last:,}) when it was set forward"
            f" ({self.repaired_at:%Y-%m-%d %H:%M:%S %Z}): its notification id was changed (or the"
            " sequence set back by hand), and a follower that read it would skip every event"
            " appended after it"
        )


def recorded_moves(
    conn: psycopg.Connection[Any], schema: str, events: str, stream: UUID | None
) -> list[RecordedMove]:
    """Every recorded row still stored at the position it was recorded at (of ``stream`` only,
    when given), in log order; none where the record does not exist (a log before it)."""
    found = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table_for(events)}"',)).fetchone()
    if found is None or found[0] is None:
        return []
    where = SQL(" WHERE r.originator_id = %s") if stream is not None else SQL("")
    rows = conn.execute(
        SQL(
            "SELECT DISTINCT ON (r.notification_id) e.originator_id, e.originator_version, r.notification_id,"
            " r.sequence_last, r.repaired_at FROM {s}.{r} r JOIN {s}.{e} e"
            " ON e.notification_id = r.notification_id AND e.originator_id::text = r.originator_id"
            " AND e.originator_version = r.originator_version{where}"
            " ORDER BY r.notification_id, r.repaired_at"
        ).format(s=Identifier(schema), r=Identifier(table_for(events)), e=Identifier(events), where=where),
        [str(stream)] if stream is not None else [],
    ).fetchall()
    return [RecordedMove(UUID(str(row[0])), int(row[1]), int(row[2]), int(row[3]), row[4]) for row in rows]
