"""The tier dashboard's arithmetic (``projections/tier_queries.py``): summed counts priced as
the calls one by one would be, the long-context rate only for calls past it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any

from flowledger.adapters.llm import load_price_table
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.pricing import LONG_CONTEXT_TOKENS
from flowledger.projections.tier_queries import reprice_by_tier

PRIORITIES = ("low", "medium", "high", "critical")
CLAUDE_ABOVE = {"high": ("claude-sonnet-4.5",), "critical": ("claude-sonnet-4.5",)}


class Rows:
    """A connection whose one query answers with rows grouped as the query groups them."""

    def __init__(self, calls: list[tuple[str, int, int]]) -> None:
        self.calls = calls  # (priority, input tokens, output tokens), one a call

    def execute(self, statement: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        groups: dict[tuple[str, bool], list[int]] = {}
        for priority, tokens_in, tokens_out in self.calls:
            group = groups.setdefault((priority, tokens_in > params["long"]), [0, 0, 0])
            group[0] += 1
            group[1] += tokens_in
            group[2] += tokens_out
        rest = (0,) * 6  # cache reads, reasoning, audio in and out, cache writes (5 m, 1 h)
        # The models asked for and answering: none named, so every policy prices at its tiers
        return [
            (p, long, None, None, n, Decimal(0), 0, i, o, *rest)
            for (p, long), (n, i, o) in sorted(groups.items())
        ]


def all_claude(calls: list[tuple[str, int, int]]) -> Any:
    """The dashboard's report of ``calls`` under one policy: every priority on Claude."""
    policy = ModelTiers(version="test", tiers={p: ("claude-sonnet-4.5",) for p in PRIORITIES})
    return reprice_by_tier(
        Rows(calls),  # type: ignore[arg-type]
        "reader",
        load_price_table(),
        {"all claude": policy},
        tenant="t",
        since=datetime(2026, 1, 1, tzinfo=UTC),
        baseline="all claude",
    )


def test_calls_each_under_the_long_context_bound_are_priced_at_the_base_rate_whatever_their_sum() -> None:
    # Given 80 "high" calls of 2,591 input tokens each: 207,280 summed, past 200k
    calls = [("high", 2_591, 100)] * 80
    assert sum(c[1] for c in calls) > LONG_CONTEXT_TOKENS
    prices = load_price_table()
    claude = prices.price_for("claude-sonnet-4.5")
    assert claude.has_long_context_tier
    # When the dashboard reprices them
    report = all_claude(calls)
    # Then each is priced as one call (it was priced at the long-context rate on the sum)
    one_by_one = sum(claude.cost(input_tokens=i, output_tokens=o) for _, i, o in calls)
    assert report.policies[0].cost_usd == one_by_one
    assert report.calls == 80


def test_a_call_past_the_bound_takes_the_long_context_rate_beside_calls_under_it() -> None:
    calls = [("high", 250_000, 100), ("high", 1_000, 100), ("low", 1_000, 50)]
    prices = load_price_table()
    claude = prices.price_for("claude-sonnet-4.5")
    report = all_claude(calls)
    assert report.policies[0].cost_usd == sum(
        claude.cost(input_tokens=i, output_tokens=o) for _, i, o in calls
    )
    assert report.calls_by_priority == {"high": 2, "low": 1}


def test_a_policy_pricing_calls_at_a_model_without_a_price_says_so_and_the_others_are_priced() -> None:
    # Given calls of two priorities, and policies of which two price the low calls at a model
    # the table has no price for (a routing file taken with unpriced models flagged)
    calls = [("low", 1_000, 50), ("medium", 2_000, 80)]
    mixed = ModelTiers(
        version="test",
        tiers={"low": ("llama-3.3-70b",), "medium": ("deepseek-v3.2",), **CLAUDE_ABOVE},
    )
    policies = {
        "configured": mixed,
        "all claude-sonnet-4.5": ModelTiers.single("claude-sonnet-4.5"),
        "all llama-3.3-70b": ModelTiers.single("llama-3.3-70b"),
    }

    # When the dashboard reprices them (it raised ValidationError "routing: no price for ...")
    report = reprice_by_tier(
        Rows(calls),  # type: ignore[arg-type]
        "reader",
        load_price_table(),
        policies,
        tenant="t",
        since=datetime(2026, 1, 1, tzinfo=UTC),
        baseline="all claude-sonnet-4.5",
    )

    # Then those two have no cost, name the model they lack, and save nothing known
    by_name = {p.policy: p for p in report.policies}
    for name in ("configured", "all llama-3.3-70b"):
        assert by_name[name].cost_usd is None
        assert by_name[name].saving_pct is None
        assert by_name[name].unpriced_models == ["llama-3.3-70b"]
    # and the baseline is priced as before
    claude = load_price_table().price_for("claude-sonnet-4.5")
    assert by_name["all claude-sonnet-4.5"].cost_usd == sum(
        claude.cost(input_tokens=i, output_tokens=o) for _, i, o in calls
    )
    assert by_name["all claude-sonnet-4.5"].unpriced_models == []


def test_a_tier_of_several_models_is_priced_at_its_cheapest_priced_one() -> None:
    # Given a tier naming a model without a price beside one with a price
    tiers = ModelTiers(
        version="test",
        tiers={"low": ("llama-3.3-70b", "gemini-2.5-flash"), "medium": ("deepseek-v3.2",), **CLAUDE_ABOVE},
    )
    report = reprice_by_tier(
        Rows([("low", 1_000, 50)]),  # type: ignore[arg-type]
        "reader",
        load_price_table(),
        {"configured": tiers},
        tenant="t",
        since=datetime(2026, 1, 1, tzinfo=UTC),
        baseline="configured",
    )
    # Then its calls are priced at the one with a price, as the router could have routed them
    (policy,) = report.policies
    assert policy.models == {"low": "gemini-2.5-flash"}
    assert policy.cost_usd is not None
    assert policy.unpriced_models == []


class CostRows(Rows):
    """``Rows`` with the recorded cost of each group given."""

    def __init__(self, groups: list[tuple[str, Decimal]]) -> None:
        super().__init__([])
        self.groups = groups

    def execute(self, statement: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(p, False, None, None, 1, cost, 0, 1_000_000, 1_000, *(0,) * 6) for p, cost in self.groups]


def test_the_tier_report_is_exact_whatever_the_threads_decimal_context() -> None:
    # Given an embedding service that set the thread's decimal context to 6 digits
    policy = ModelTiers(version="test", tiers={p: ("claude-sonnet-4.5",) for p in PRIORITIES})
    groups = [("low", Decimal("1234.000001")), ("high", Decimal("0.0000001"))]
    with localcontext() as context:
        context.prec = 6
        report = reprice_by_tier(
            CostRows(groups),  # type: ignore[arg-type]
            "reader",
            load_price_table(),
            {"all claude": policy},
            tenant="t",
            since=datetime(2026, 1, 1, tzinfo=UTC),
            baseline="all claude",
        )
    # Then the recorded cost is the exact sum (it read 1234.00: rounded to the thread's 6 digits)
    assert report.recorded_cost_usd == Decimal("1234.0000011")
    # and each policy's cost the exact sum of its priced calls: 2 x (1,000,000 x $3/M + 1,000 x $15/M)
    [claude] = report.policies
    assert claude.cost_usd == 2 * (Decimal("3") + Decimal("0.015"))
