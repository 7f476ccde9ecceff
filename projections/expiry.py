"""The expiry sweep: record ``Expired`` for every session of a tenant whose expiry has passed.

A session's expiry is judged when a command reaches it (``Session.ensure_open``), so one that
nobody touches again stays ``active`` in its events, and in every read model folded from
them (the current state, the funnel's ``in_progress``), until something records it. The
sweep finds the candidates in the current-state read model (active, expiry at or before the
engine's clock), caught up and read on the primary even with a replica configured, and asks
the engine to expire each (``Engine.expire_session``), which judges it again on the session
itself: a candidate extended or closed since the read model saw it
is left as it is, and a sweep run twice, or by two processes at once, records each
``Expired`` once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flowledger.domain.errors import SessionNotFound
from flowledger.domain.session_rules import require_sweep_limit
from flowledger.infrastructure.engine.facade import Engine
from flowledger.projections.processor import Projector
from flowledger.projections.sql import q

OVERDUE = """
SELECT session_id FROM {s}.sessions
WHERE tenant = %(tenant)s AND status = 'active' AND expires_at <= %(now)s
ORDER BY expires_at, session_id LIMIT %(limit)s
"""


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What one sweep did: the sessions it expired, and the candidates it looked at."""

    expired: list[str]
    examined: int
    complete: bool
    """False when ``limit`` candidates were found: more may be overdue (run it again)."""


def expire_overdue(
    engine: Engine,
    projector: Projector,
    *,
    limit: int = 1_000,
    on_session: Callable[[str, bool], None] | None = None,
) -> Sweep:
    """Expire up to ``limit`` of the engine's tenant's overdue sessions, the longest overdue
    first; ``on_session(session_id, expired)`` is told of each candidate (progress). A limit
    outside 1 to ``MAX_SWEEP`` is a ValidationError, before anything is read."""
    require_sweep_limit(limit)
    # Caught up and read on the primary, never on a replica: the sweep writes there anyway, and
    # a replica's read model that lagged (a follower stopped, replay paused) listed the sessions
    # the last sweep had expired again and again, so a sweep with a limit never got past them.
    projector.catch_up()
    with projector.connect_reader(primary=True) as conn:
        rows = conn.execute(
            q(OVERDUE, projector.names.reader),
            {"tenant": engine.tenant, "now": engine.clock(), "limit": limit},
        ).fetchall()
    expired: list[str] = []
    for (session_id,) in rows:
        try:
            done = engine.expire_session(session_id)
        except SessionNotFound:  # the read model lags a deletion (retention, erasure tools)
            done = False
        if done:
            expired.append(session_id)
        if on_session is not None:
            on_session(session_id, done)
    return Sweep(expired=expired, examined=len(rows), complete=len(rows) < limit)
