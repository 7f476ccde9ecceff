"""Repricing recorded task calls as if another model-tier policy had routed them.

The seed estimates that its mixed strategy (critical work on a premium model, routine work
on budget ones) "saves 73 %" against one premium model, from assumed volumes and token
counts. Here the same comparison is computed from the calls the log recorded: the task
calls' tokens are summed per the priority the task had when each call was made (the cost
view's ``task_priority``: the one that chose the call's tier, not the current one, which
the classification may have raised since), and each policy prices a priority's sums at its
tier's model, by the domain's one pricing rule (``cost_of``: linear, so summed tokens price
the same as the calls one by one). So the configured policy prices the calls it routed at
the models that made them: at their recorded cost, up to price-table changes (and calls
retried on a fallback model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.errors import ValidationError
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.pricing import LONG_CONTEXT_TOKENS, PriceTable, TokenCounts, cost_of


@dataclass(frozen=True, kw_only=True)
class PolicyCost:
    """What the recorded task calls cost under one policy, and its saving against the baseline."""

    policy: str
    models: dict[str, str]
    """The model each priority is priced at."""
    cost_usd: Decimal
    saving_pct: Decimal | None
    """(baseline - cost) / baseline x 100; None when the baseline costs nothing."""


@dataclass(frozen=True, kw_only=True)
class TierReport:
    """Recorded task calls and what they would cost under each policy."""

    calls: int
    calls_by_priority: dict[str, int]
    recorded_cost_usd: Decimal
    baseline: str
    policies: list[PolicyCost]


def tier_policies(configured: ModelTiers) -> tuple[dict[str, ModelTiers], str]:
    """The policies a what-if compares: the configured tiers, and every priority on one of
    their models; and the baseline savings are measured against, the configured premium
    (critical) model alone (the seed's "mixed saves 73 %")."""
    policies = {"configured": configured, **{f"all {m}": ModelTiers.single(m) for m in configured.models()}}
    return policies, f"all {configured.tiers['critical'][0]}"


def tier_model(tiers: ModelTiers, priority: str, prices: PriceTable) -> str:
    """The model a policy prices a priority's calls at: its tier's cheapest (for a typical call)."""
    models = tiers.tiers[priority]
    unknown = [m for m in models if not prices.knows(m)]
    if unknown:
        raise ValidationError("routing", f"no price for {unknown} in {prices.version}")
    return min(models, key=lambda m: (prices.estimate(m, input_tokens=300, output_tokens=60), m))


def reprice_by_tier(
    conn: Connection[Any],
    reader: str,
    prices: PriceTable,
    policies: Mapping[str, ModelTiers],
    *,
    tenant: str,
    since: datetime,
    baseline: str,
    now: datetime | None = None,
) -> TierReport:
    """The tenant's task calls since ``since``, priced under each policy (``baseline`` names
    the one savings are measured against) at the prices in force ``now`` (default: the
    present), never at an entry that takes effect later."""
    if baseline not in policies:
        raise ValidationError("baseline", f"must be one of {sorted(policies)}, got {baseline!r}")
    # Summed per priority and per price tier of the call (past LONG_CONTEXT_TOKENS input
    # tokens a call takes the long-context rate): within a tier the rule is linear, so the
    # sums price exactly as the calls one by one would.
    statement = sql.SQL("""
        SELECT c.task_priority, c.input_tokens > %(long)s, count(*), coalesce(sum(c.cost_usd), 0),
               sum(c.input_tokens), sum(c.output_tokens), sum(c.cache_read_input_tokens),
               sum(c.reasoning_output_tokens), sum(c.audio_input_tokens), sum(c.audio_output_tokens),
               sum(c.cache_creation_input_tokens), sum(c.cache_creation_1h_input_tokens)
        FROM {reader}.llm_calls AS c
        WHERE c.tenant = %(tenant)s AND c.source = 'task' AND c.occurred_at >= %(since)s
          AND c.task_priority IS NOT NULL
        GROUP BY 1, 2 ORDER BY 1, 2
    """).format(reader=sql.Identifier(reader))
    sums: dict[tuple[str, bool], TokenCounts] = {}
    calls: dict[str, int] = {}
    recorded = Decimal(0)
    rows = conn.execute(statement, {"tenant": tenant, "since": since, "long": LONG_CONTEXT_TOKENS})
    for priority, long_context, count, cost, *tokens in rows:
        calls[priority] = calls.get(priority, 0) + int(count)
        recorded += cost
        sums[(priority, bool(long_context))] = TokenCounts(
            input_tokens=int(tokens[0]),
            output_tokens=int(tokens[1]),
            cache_read_input_tokens=int(tokens[2]),
            reasoning_output_tokens=int(tokens[3]),
            audio_input_tokens=int(tokens[4]),
            audio_output_tokens=int(tokens[5]),
            cache_creation_input_tokens=int(tokens[6]),
            cache_creation_1h_input_tokens=int(tokens[7]),
        )
    costs: dict[str, tuple[dict[str, str], Decimal]] = {}
    at = now if now is not None else datetime.now(UTC)
    for name, tiers in policies.items():
        models = {p: tier_model(tiers, p, prices) for p in calls}
        cost = sum(
            (
                cost_of(tokens, prices.price_for(models[p], at), long_context=long)
                for (p, long), tokens in sums.items()
            ),
            Decimal(0),
        )
        costs[name] = (models, cost)
    base = costs[baseline][1]
    return TierReport(
        calls=sum(calls.values()),
        calls_by_priority=calls,
        recorded_cost_usd=recorded,
        baseline=baseline,
        policies=[
            PolicyCost(
                policy=name,
                models=models,
                cost_usd=cost,
                saving_pct=((base - cost) / base * 100).quantize(Decimal("0.1")) if base else None,
            )
            for name, (models, cost) in costs.items()
        ],
    )
