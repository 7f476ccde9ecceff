"""The tier dashboard groups each task call by the priority the task had when the call was made
(the priority that routed it), not by the one it has now: a medium task classified on the
medium tier's model and raised to critical by that classification is priced, under the
configured policy, at the medium tier's model, which is what it cost."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from flowledger.adapters.llm import load_price_table
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for, rebuild, verify
from flowledger.projections.tier_queries import TierReport, reprice_by_tier
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres

PRICES = load_price_table()


def usage(model: str, input_tokens: int, output_tokens: int) -> LlmUsage:
    """A call on ``model`` at its list price, as the real client records it."""
    cost = PRICES.price_for(model).cost(input_tokens=input_tokens, output_tokens=output_tokens)
    return LlmUsage(
        provider="double",
        request_model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost,
        price_version=PRICES.version,
    )


def answer(complexity: str) -> str:
    return json.dumps({"category": "bug_fix", "complexity": complexity, "estimated_hours": 3})


def report(engine: Engine) -> TierReport:
    projector = projector_for(engine, batch_size=2)
    projector.catch_up()
    configured = engine.classifier.tiers
    with projector.connect_reader() as conn:
        return reprice_by_tier(
            conn,
            projector.names.reader,
            PRICES,
            {"configured": configured, "all claude-sonnet-4.5": configured.single("claude-sonnet-4.5")},
            tenant=engine.tenant,
            since=engine.clock() - timedelta(hours=1),
            baseline="all claude-sonnet-4.5",
        )


async def test_a_call_is_priced_at_the_tier_of_the_priority_that_routed_it(pg_engine: Engine) -> None:
    engine = pg_engine
    # Given a medium task whose classification (on the medium tier's model) raised it to critical
    engine.create_task("raised", "Fix the race in the Go worker", priority="medium")
    engine.llm = llm = ScriptedLlm(answer("critical"), usage=usage("deepseek-v3.2", 300, 60))
    raised = await engine.classify_task("raised")
    assert llm.calls[-1].model == "deepseek-v3.2"
    assert raised.priority.value == "critical"
    # And a critical task classified on the critical tier's model, and raised by nothing
    engine.create_task("critical", "Fix the outage", priority="critical")
    engine.llm = ScriptedLlm(answer("low"), usage=usage("claude-sonnet-4.5", 400, 80))
    await engine.classify_task("critical")
    # And a low task classified again after the first raised it to high: the second call was
    # made at high (on the high tier's model)
    engine.create_task("twice", "Tidy the README", priority="low")
    engine.llm = ScriptedLlm(answer("high"), usage=usage("gemini-2.5-flash", 200, 40))
    await engine.classify_task("twice")
    engine.llm = llm = ScriptedLlm(answer("low"), usage=usage("claude-sonnet-4.5", 210, 45))
    again = await engine.reclassify_task("twice")
    assert (llm.calls[-1].model, again.priority.value) == ("claude-sonnet-4.5", "low")

    # When the dashboard reprices the recorded calls
    tiers = report(engine)

    # Then each call counts under the priority it was made at, and the configured policy's
    # cost is what the calls cost
    assert tiers.calls_by_priority == {"medium": 1, "critical": 1, "low": 1, "high": 1}
    configured = next(p for p in tiers.policies if p.policy == "configured")
    assert configured.models == {
        "medium": "deepseek-v3.2",
        "critical": "claude-sonnet-4.5",
        "low": "gemini-2.5-flash",
        "high": "claude-sonnet-4.5",
    }
    assert configured.cost_usd == tiers.recorded_cost_usd > Decimal(0)

    # And a full rebuild gives the same rows; verify finds no difference
    projector = projector_for(engine, batch_size=1000)
    rebuild(projector)
    assert report(engine) == tiers
    assert verify(projector) == []


async def test_a_calls_cache_writes_are_priced_at_their_rates_under_every_policy(pg_engine: Engine) -> None:
    engine = pg_engine
    # Given a critical task classified on Claude by a call that wrote 1,000 tokens to the cache
    # (200 of them for an hour), priced at Claude's cache-write rates as the client prices it
    engine.create_task("cached", "Fix the outage", priority="critical")
    tokens = {"input_tokens": 1_500, "output_tokens": 80, "cache_creation_input_tokens": 1_000}
    claude = PRICES.price_for("claude-sonnet-4.5")
    called = LlmUsage(
        provider="double",
        request_model="claude-sonnet-4.5",
        **tokens,
        cache_creation_1h_input_tokens=200,
        cost_usd=claude.cost(**tokens, cache_creation_1h_input_tokens=200),
        price_version=PRICES.version,
    )
    assert called.cost_usd > claude.cost(input_tokens=1_500, output_tokens=80)
    engine.llm = ScriptedLlm(answer("low"), usage=called)
    await engine.classify_task("cached")

    # When the dashboard reprices the recorded calls
    tiers = report(engine)

    # Then the configured policy (Claude for critical work) prices the call at what it cost,
    # cache writes at their own rates, not at the input rate
    configured = next(p for p in tiers.policies if p.policy == "configured")
    assert configured.models == {"critical": "claude-sonnet-4.5"}
    assert configured.cost_usd == tiers.recorded_cost_usd == called.cost_usd


async def test_the_recorded_cost_counts_retried_attempts_and_names_the_calls_it_could_not_price(
    pg_engine: Engine,
) -> None:
    engine = pg_engine
    # Given three medium task calls on deepseek: one answered at once, one answered on its
    # second attempt (the first billed as much), one whose cost is not known (unpriced)
    plain = usage("deepseek-v3.2", 300, 60)
    retried = replace(
        plain, attempts=2, retried_cost_usd=plain.cost_usd, retried_tokens={"input_tokens": 300}
    )
    unknown = replace(plain, cost_usd=Decimal(0), unpriced=True)
    for task, called in (("plain", plain), ("retried", retried), ("unknown", unknown)):
        engine.create_task(task, "Fix the race in the Go worker", priority="medium")
        engine.llm = ScriptedLlm(answer("medium"), usage=called)
        await engine.classify_task(task)

    # When the dashboard reprices them
    tiers = report(engine)

    # Then the recorded cost is the dashboard's (answers and retried attempts: $0.0003276
    # here, where it read $0.0002184), and the call it could not price is counted, not $0
    assert tiers.calls == 3
    assert tiers.recorded_cost_usd == plain.cost_usd * 3
    assert tiers.unpriced_calls == 1
