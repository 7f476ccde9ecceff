"""``prices reprice``: what a repricing changes per model and day (read from the log), and
applying it (recorded, then the cost projection rebuilt); the events are never touched."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.values import LlmUsage
from flowledger.projections.calls import call_of
from flowledger.projections.cost import CostDashboard
from flowledger.projections.processor import Projector
from flowledger.projections.rebuild import rebuild
from flowledger.projections.repricing import Change, Repricing, RepricingCache, changes, record_repricing
from flowledger.projections.seed import SeedTables

_BATCH = 5000


@dataclass(frozen=True)
class Recorded:
    """What the cost projection holds for one model's calls on one day (UTC)."""

    calls: int
    unpriced: int
    cost_usd: Decimal


def plan(projector: Projector, repricing: Repricing) -> list[Change]:
    """Per model and day, the cost projection's cost of the calls since the repricing's start
    as it stands, and as it will stand once the repricing is applied (the cost projection is
    caught up first)."""
    projector.catch_up([CostDashboard.name])
    with projector.connect() as conn:
        with conn.cursor() as cur:
            before = RepricingCache().load(cur, projector.names.control)
        first = conn.execute(
            sql.SQL("SELECT min(id) FROM {}.llm_calls WHERE occurred_at >= %s").format(
                sql.Identifier(projector.names.reader)
            ),
            [repricing.effective_from],
        ).fetchone()
    if first is None or first[0] is None:
        return []
    return changes(_calls(projector, int(first[0])), before, repricing)


def _calls(projector: Projector, start: int) -> Iterator[tuple[str | None, datetime, LlmUsage]]:
    """Every model call with usage in the log from notification ``start`` on, with its model
    (None when its usage named none: as '(none)' it was one row with a model named so)."""
    topics = sorted(CostDashboard().topics)
    head = projector.head()
    while start <= head:
        notes = projector.read(start, head, topics, limit=_BATCH)
        if not notes:
            return
        for note in notes:
            event: Any = projector.mapper.to_domain_event(note)
            call = call_of(event)
            if call is not None and call.usage is not None:
                yield call.model, event.timestamp, call.usage
        start = notes[-1].id + 1


def apply(projector: Projector, repricing: Repricing, document: str) -> str:
    """Record ``repricing`` (with its price file's text) and rebuild the cost projection with
    it, and the seed tables (their executions' costs are the dashboard's) when the projector
    keeps them; returns the cost projection's new build's schema."""
    with projector.connect() as conn, conn.transaction(), conn.cursor() as cur:
        record_repricing(cur, projector.names.control, repricing, document)
    names = [CostDashboard.name, *(p.name for p in projector.projections if p.name == SeedTables.name)]
    return rebuild(projector, names)[CostDashboard.name]


def recorded_costs(conn: Connection[Any], reader: str, since: datetime) -> dict[tuple[str, date], Recorded]:
    """The cost projection's calls since ``since`` per model and day (UTC), every tenant."""
    rows = conn.execute(
        sql.SQL(
            "SELECT model, (occurred_at AT TIME ZONE 'UTC')::date, count(*),"
            " count(*) FILTER (WHERE unpriced), sum(cost_usd + retried_cost_usd)"
            " FROM {}.llm_calls WHERE occurred_at >= %s AND model IS NOT NULL GROUP BY 1, 2"
        ).format(sql.Identifier(reader)),
        [since],
    ).fetchall()
    return {(model, day): Recorded(calls, unpriced, cost) for model, day, calls, unpriced, cost in rows}
