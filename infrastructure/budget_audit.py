"""The budget ledger's terms compared with what the Budget aggregates' events recorded
(``flowledger audit verify``; docs/budgets.md).

Enforcement reads the ledger table ``<schema>.budgets``, not the events: a limit raised from
5 to 1000 (or a mode turned from ``enforce`` to ``alert``) by SQL let calls spend past what
``budgets set`` recorded, and ``audit verify`` said ok, since it reads only the event log.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.utils import get_topic
from psycopg.sql import SQL, Identifier

from flowledger.domain.budget import Budget
from flowledger.infrastructure.engine.store import AggregateStore

_ROWS = "SELECT budget_id, tenant, scope, subject, period, limit_usd, mode, webhook_url FROM {}"
_DEFINED = "SELECT DISTINCT originator_id FROM {} WHERE topic = %s"
_COMPARED = ("tenant", "scope", "subject", "period", "limit_usd", "mode", "webhook_url")


def budget_problems(
    conn: psycopg.Connection[Any], schema: str, events_table: str, store: AggregateStore
) -> list[str]:
    """One line per budget whose ledger row differs from its events, was deleted while its
    events say it is set, or has no events (inserted); none when the ledger has no table."""
    found = conn.execute("SELECT to_regclass(%s)", [Identifier(schema, "budgets").as_string(conn)]).fetchone()
    if not (found and found[0]):
        return []
    rows = {row[0]: row for row in conn.execute(SQL(_ROWS).format(Identifier(schema, "budgets")))}
    defined = conn.execute(
        SQL(_DEFINED).format(Identifier(schema, events_table)), [get_topic(Budget.Defined)]
    ).fetchall()
    problems: list[str] = []
    for budget_id in sorted({row[0] for row in defined} | rows.keys(), key=str):
        problem = _compared(budget_id, rows.get(budget_id), store)
        if problem is not None:
            problems.append(problem)
    return problems


def _compared(budget_id: UUID, row: Any, store: AggregateStore) -> str | None:
    try:
        budget: Budget | None = store.load(budget_id)
    except Exception as error:  # a row of its stream that does not read: the chain check names it
        return f"budget {budget_id}: not compared, its events do not read: {error}"
    if budget is None:
        return f"budget {budget_id}: its ledger row has no events (inserted in the database)"
    name = f"budget {budget.scope}:{budget.subject}/{budget.period} (tenant {budget.tenant}, {budget_id})"
    if row is None:
        if budget.removed:
            return None
        return f"{name}: its ledger row is missing, though its events say it is set (deleted in the database)"
    if budget.removed:
        return (
            f"{name}: its ledger row is there, though its events say it was removed (written in the database)"
        )
    recorded = dict(zip(_COMPARED, row[1:], strict=True))
    differ = [field for field in _COMPARED if recorded[field] != getattr(budget, field)]
    if not differ:
        return None
    said = ", ".join(f"{field} {recorded[field]} (its events: {getattr(budget, field)})" for field in differ)
    return f"{name}: its ledger row differs from its events: {said} (edited in the database)"
