"""Repricing recorded task calls as if another model-tier policy had routed them.

The seed estimates that its mixed strategy (critical work on a premium model, routine work
on budget ones) "saves 73 %" against one premium model, from assumed volumes and token
counts. Here the same comparison is computed from the calls the log recorded: the task
calls' tokens are summed per the priority the task had when each call was made (the cost
view's ``task_priority``: the one that chose the call's tier, not the current one, which
the classification may have raised since), and each policy prices a priority's sums at its
tier's model, by the domain's one pricing rule (``cost_of``: linear, so summed tokens price
the same as the calls one by one). The configured policy (``as_made``) prices each call at
the model that made it instead (the entry the adapter charged, ``billed_model``): at the
answers' recorded cost, up to price-table changes, a call the caller named a model for
included (priced at the tier's model, a classification on gpt-4.1 that cost $0.00036 counted
$0.0000364 at deepseek-v3.2, a saving shown that no routing made). The recorded cost beside
it is the cost dashboard's (retried attempts included), and the calls whose cost is not
known (``unpriced``) are counted apart: they were summed as $0, unsaid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any, NamedTuple

from psycopg import Connection, sql

from flowledger.domain.errors import ValidationError
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.pricing import EXACT, LONG_CONTEXT_TOKENS, PriceTable, TokenCounts, cost_of


class _Group(NamedTuple):
    """Task calls summed together: of one priority, one side of the long-context bound, asking
    for one model (``asked``) and answered by one (``answered``, else the one asked for)."""

    priority: str
    long_context: bool
    asked: str | None
    answered: str | None


@dataclass(frozen=True, kw_only=True)
class PolicyCost:
    """What the recorded task calls cost under one policy, and its saving against the baseline."""

    policy: str
    models: dict[str, str]
    """The model each priority is priced at; for the policy priced as made, the models that made
    its calls (sorted, joined by ", " when there are several)."""
    cost_usd: Decimal | None
    """None when some of the calls would be priced at a model the table has no price for."""
    saving_pct: Decimal | None
    """(baseline - cost) / baseline x 100; None when the baseline costs nothing, or either
    cost is not known."""
    unpriced_models: list[str]
    """The models of ``models`` the price table has no price for (then ``cost_usd`` is None)."""


@dataclass(frozen=True, kw_only=True)
class TierReport:
    """Recorded task calls and what they would cost under each policy."""

    calls: int
    calls_by_priority: dict[str, int]
    recorded_cost_usd: Decimal
    """What they were billed, as the cost dashboard sums it: each answer's cost plus its retried
    attempts' (``retried_cost_usd``); an ``unpriced`` call adds what of it is known."""
    baseline: str
    policies: list[PolicyCost]
    unpriced_calls: int = 0
    """Of ``calls``, those whose recorded cost is not known (``unpriced``: no price, or billed
    for tokens not reported): ``recorded_cost_usd`` holds only what of them is known."""

    @property
    def unpriced_note(self) -> str:
        """What the recorded cost leaves out, to follow it: `` (1 of them unpriced: cost not
        known)``, or nothing when every call's cost is known."""
        if not self.unpriced_calls:
            return ""
        return f" ({self.unpriced_calls:,} of them unpriced: cost not known)"


CONFIGURED = "configured"
"""The name of the configured policy in a what-if (``tier_policies``): the one priced as made."""


def tier_policies(configured: ModelTiers) -> tuple[dict[str, ModelTiers], str]:
    """The policies a what-if compares: the configured tiers (``CONFIGURED``, to be priced as
    made), and every priority on one of their models; and the baseline savings are measured
    against, the configured premium (critical) model alone (the seed's "mixed saves 73 %")."""
    policies = {CONFIGURED: configured, **{f"all {m}": ModelTiers.single(m) for m in configured.models()}}
    return policies, f"all {configured.tiers['critical'][0]}"


def tier_model(tiers: ModelTiers, priority: str, prices: PriceTable, at: datetime | None = None) -> str:
    """The model a policy prices a priority's calls at: its tier's cheapest (for a typical call)
    of those with a price at ``at``; its first when none has one (the policy's cost is then not
    known). A routing file naming a model without a price is taken when unpriced calls are
    flagged (``FLOWLEDGER_LLM_UNPRICED_MODELS=flag``): raised here, it made the whole what-if,
    and the dashboard page around it, a 422 once any task call was recorded."""
    models = tiers.tiers[priority]
    priced = [m for m in models if prices.knows(m, at)]
    if not priced:
        return models[0]
    return min(priced, key=lambda m: (prices.price_for(m, at).cost(input_tokens=300, output_tokens=60), m))


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
    as_made: str | None = None,
) -> TierReport:
    """The tenant's task calls since ``since``, priced under each policy (``baseline`` names
    the one savings are measured against) at the prices in force ``now`` (default: the
    present), never at an entry that takes effect later; the policy named ``as_made`` (the
    configured one) prices each call at the model that made it."""
    if baseline not in policies:
        raise ValidationError("baseline", f"must be one of {sorted(policies)}, got {baseline!r}")
    if as_made is not None and as_made not in policies:
        raise ValidationError("as_made", f"must be one of {sorted(policies)}, got {as_made!r}")
    # Summed per priority, per price tier of the call (past LONG_CONTEXT_TOKENS input tokens
    # a call takes the long-context rate) and per model asked for and answering (the policy
    # priced as made prices each at its own): within a tier the rule is linear, so the sums
    # price exactly as the calls one by one would.
    statement = sql.SQL("""
        SELECT c.task_priority, c.input_tokens > %(long)s, c.request_model, c.model, count(*),
               coalesce(sum(c.cost_usd + c.retried_cost_usd), 0), count(*) FILTER (WHERE c.unpriced),
               sum(c.input_tokens), sum(c.output_tokens), sum(c.cache_read_input_tokens),
               sum(c.reasoning_output_tokens), sum(c.audio_input_tokens), sum(c.audio_output_tokens),
               sum(c.cache_creation_input_tokens), sum(c.cache_creation_1h_input_tokens)
        FROM {reader}.llm_calls AS c
        WHERE c.tenant = %(tenant)s AND c.source = 'task' AND c.occurred_at >= %(since)s
          AND c.task_priority IS NOT NULL
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    """).format(reader=sql.Identifier(reader))
    sums: dict[_Group, TokenCounts] = {}
    calls: dict[str, int] = {}
    recorded = Decimal(0)
    unpriced_calls = 0
    rows = conn.execute(statement, {"tenant": tenant, "since": since, "long": LONG_CONTEXT_TOKENS})
    for priority, long_context, asked, answered, count, cost, unpriced_count, *tokens in rows:
        calls[priority] = calls.get(priority, 0) + int(count)
        unpriced_calls += int(unpriced_count)
        with localcontext(EXACT):  # money: the thread's context rounds (28 digits, or fewer)
            recorded += cost
        sums[_Group(priority, bool(long_context), asked, answered)] = TokenCounts(
            input_tokens=int(tokens[0]),
            output_tokens=int(tokens[1]),
            cache_read_input_tokens=int(tokens[2]),
            reasoning_output_tokens=int(tokens[3]),
            audio_input_tokens=int(tokens[4]),
            audio_output_tokens=int(tokens[5]),
            cache_creation_input_tokens=int(tokens[6]),
            cache_creation_1h_input_tokens=int(tokens[7]),
        )
    costs: dict[str, tuple[dict[str, str], Decimal | None, list[str]]] = {}
    at = now if now is not None else datetime.now(UTC)
    for name, tiers in policies.items():
        routed = {p: tier_model(tiers, p, prices, at) for p in calls}
        priced_at = {
            group: (_made_by(group, prices) or routed[group.priority])
            if name == as_made
            else routed[group.priority]
            for group in sums
        }
        unpriced = sorted({m for m in priced_at.values() if not prices.knows(m, at)})
        with localcontext(EXACT):  # as above: each cost is exact, and so must their sum be
            cost = (
                None
                if unpriced
                else sum(
                    (
                        cost_of(
                            tokens, prices.price_for(priced_at[group], at), long_context=group.long_context
                        )
                        for group, tokens in sums.items()
                    ),
                    Decimal(0),
                )
            )
        models = {
            p: ", ".join(sorted({m for group, m in priced_at.items() if group.priority == p})) for p in calls
        }
        costs[name] = (models, cost, unpriced)
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
                saving_pct=_saving(base, cost),
                unpriced_models=unpriced,
            )
            for name, (models, cost, unpriced) in costs.items()
        ],
        unpriced_calls=unpriced_calls,
    )


def _made_by(group: _Group, prices: PriceTable) -> str | None:
    """The model a group's calls were charged as (``billed_model``: the one that answered when
    it is known as another, else the one asked for), else the name they give; None when they
    name none."""
    return prices.billed_model(group.asked, group.answered) or group.asked or group.answered


def _saving(base: Decimal | None, cost: Decimal | None) -> Decimal | None:
    """(base - cost) / base x 100 to 0.1 %; None when either is not known or base is nothing."""
    if not base or cost is None:
        return None
    return ((base - cost) / base * 100).quantize(Decimal("0.1"))
