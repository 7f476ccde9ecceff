"""Where each projection build stands: its position in the log, how far behind the head it is,
and the events it set aside as dead letters."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from flowledger.projections import dead_letters
from flowledger.projections.catalog import ensure_control, lock_key
from flowledger.projections.dead_letters import DeadLetter
from flowledger.projections.processor import Projector
from flowledger.projections.sql import q


@dataclass(frozen=True)
class BuildStatus:
    """One build: live (read by dashboards), a rebuild in progress (``rebuilding``), a verify
    scratch (``verifying``), or what a rebuild or verify left when its process died
    (``abandoned``: nobody holds that projection's rebuild lock; the next rebuild, or for a
    verify scratch the next verify, drops it). A rebuild killed mid-way was listed as
    ``rebuilding`` for good, its lag growing, as if it were still running."""

    projection: str
    schema: str
    state: str
    position: int
    events: int
    head: int
    updated_at: datetime
    dead_letters: int = 0
    """Events this build could not apply (see ``dead_letters``)."""
    schema_version: int = 1

    @property
    def lag(self) -> int:
        """Notification ids between the build's position and the head of the log."""
        return max(self.head - self.position, 0)


def status(projector: Projector) -> list[BuildStatus]:
    """Every build of every projection, live ones first."""
    head = projector.head()
    names = projector.names
    with projector.briefly() as conn:
        ensure_control(conn, names)
        rows = conn.execute(
            q(
                "SELECT b.projection, b.schema_name, CASE WHEN a.projection IS NOT NULL THEN 'live'"
                " WHEN NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
                " AND l.objsubid = 1 AND l.granted AND l.database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
                " AND (l.classid::bigint << 32 | l.objid::bigint) = hashtext(%s || b.projection)::bigint)"
                " THEN 'abandoned'"
                " WHEN b.kind = 'scratch' THEN 'verifying' ELSE 'rebuilding' END,"
                " b.position, b.events, b.updated_at,"
                " (SELECT count(*) FROM {s}.dead_letters d WHERE d.schema_name = b.schema_name),"
                " b.schema_version"
                " FROM {s}.builds b LEFT JOIN {s}.active a ON a.schema_name = b.schema_name"
                " ORDER BY b.projection, a.projection IS NULL, b.schema_name",
                names.control,
            ),
            [lock_key(names.store, "rebuild", "")],
        ).fetchall()
    return [
        BuildStatus(r[0], r[1], r[2], int(r[3]), int(r[4]), head, r[5], int(r[6]), int(r[7])) for r in rows
    ]


def dead_letter_events(projector: Projector, schemas: Collection[str]) -> int:
    """How many events the builds in ``schemas`` set aside (each is a dead letter of every build
    that could not apply it)."""
    with projector.briefly() as conn:
        ensure_control(conn, projector.names)
        with conn.cursor() as cur:
            return dead_letters.events_of(cur, projector.names, sorted(schemas))


def recent_dead_letters(
    projector: Projector,
    *,
    live_only: bool = True,
    schemas: Collection[str] | None = None,
    limit: int = 20,
) -> list[DeadLetter]:
    """The newest dead letters (of the live builds only, by default; of the builds in
    ``schemas`` when given), newest first."""
    names = projector.names
    with projector.briefly() as conn:
        ensure_control(conn, names)
        with conn.cursor() as cur:
            if schemas is not None:
                return dead_letters.listed(cur, names, schemas=sorted(schemas), limit=limit)
            live: list[str] | None = None
            if live_only:
                cur.execute(q("SELECT schema_name FROM {s}.active", names.control))
                live = [row[0] for row in cur.fetchall()]
            return dead_letters.listed(cur, names, schemas=live, limit=limit)
