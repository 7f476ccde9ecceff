"""The model-tier what-if, for ``GET /v1/dashboard/tiers`` and the dashboard page's panel: the
task calls recorded in a window, priced as if each tier policy had routed them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import Connection

from flowledger.adapters.http.page_text import escape
from flowledger.adapters.http.served_prices import served_prices
from flowledger.domain.task_views import TaskPriority
from flowledger.domain.values import plain_decimal
from flowledger.infrastructure import Engine
from flowledger.projections.tier_queries import (
    CONFIGURED,
    PolicyCost,
    TierReport,
    reprice_by_tier,
    tier_policies,
)

_URGENT_FIRST = sorted(TaskPriority, key=lambda p: -p.rank)


def tier_report(
    engine: Engine, conn: Connection[Any], reader: str, *, tenant: str, since: datetime
) -> TierReport:
    """The task calls of ``tenant`` since ``since`` under each policy of ``tier_policies``, the
    configured one priced at the models that made the calls."""
    policies, baseline = tier_policies(engine.classifier.tiers)
    prices = served_prices(engine)
    return reprice_by_tier(
        conn, reader, prices, policies, tenant=tenant, since=since, baseline=baseline, as_made=CONFIGURED
    )


def tier_panel(report: TierReport) -> str:
    """An HTML panel: each policy's model per priority, its cost and its saving against the
    baseline; empty when the window holds no task call."""
    if not report.calls:
        return ""
    head = "".join(
        f"<th>{p.value} ({report.calls_by_priority.get(p.value, 0):,})</th>" for p in _URGENT_FIRST
    )
    rows = "".join(
        "<tr>"
        + f"<td>{escape(policy.policy)}</td>"
        + "".join(f"<td>{escape(policy.models.get(p.value, '-'))}</td>" for p in _URGENT_FIRST)
        + f"<td>{_cost(policy)}</td>"
        + f"<td>{'-' if policy.saving_pct is None else f'{policy.saving_pct}%'}</td></tr>"
        for policy in report.policies
    )
    caption = (
        f"{report.calls:,} task calls recorded at ${plain_decimal(report.recorded_cost_usd)}"
        f"{escape(report.unpriced_note)}, "
        f"priced as if each policy had routed them (saving against {escape(report.baseline)})"
    )
    return (
        f'<section class="grid"><div class="panel"><h3>model tiers: what if</h3><p>{caption}</p><table>'
        f"<tr><th>policy</th>{head}<th>cost</th><th>saving</th></tr>{rows}</table></div></section>"
    )


def _cost(policy: PolicyCost) -> str:
    """A policy's cost cell: the amount, or which models it lacks a price for."""
    if policy.cost_usd is None:
        return escape(f"no price for {', '.join(policy.unpriced_models)}")
    return f"${plain_decimal(policy.cost_usd)}"
