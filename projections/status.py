"""Where each projection build stands: its position in the log and how far behind the head it is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from flowledger.projections.catalog import ensure_control
from flowledger.projections.processor import Projector
from flowledger.projections.sql import q


@dataclass(frozen=True)
class BuildStatus:
    """One build: live (read by dashboards), a rebuild in progress, or a verify scratch."""

    projection: str
    schema: str
    state: str
    position: int
    events: int
    head: int
    updated_at: datetime

    @property
    def lag(self) -> int:
        """Notification ids between the build's position and the head of the log."""
        return max(self.head - self.position, 0)


def status(projector: Projector) -> list[BuildStatus]:
    """Every build of every projection, live ones first."""
    head = projector.recorder.max_notification_id() or 0
    names = projector.names
    with projector.connect() as conn:
        ensure_control(conn, names)
        rows = conn.execute(
            q(
                "SELECT b.projection, b.schema_name, CASE WHEN a.projection IS NOT NULL THEN 'live'"
                " WHEN b.kind = 'scratch' THEN 'verifying' ELSE 'rebuilding' END,"
                " b.position, b.events, b.updated_at"
                " FROM {s}.builds b LEFT JOIN {s}.active a ON a.schema_name = b.schema_name"
                " ORDER BY b.projection, a.projection IS NULL, b.schema_name",
                names.control,
            )
        ).fetchall()
    return [BuildStatus(r[0], r[1], r[2], int(r[3]), int(r[4]), head, r[5]) for r in rows]
