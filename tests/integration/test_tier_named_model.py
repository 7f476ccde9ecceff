"""The tier what-if's configured policy prices each task call at the model that made it: a
classification the caller named a model for (``classify_task(model=...)``, REST's ``"model"``,
the CLI's ``--model``) was priced at its priority's tier model instead, so the configured row
showed a saving the calls never made."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from flowledger.adapters.http.tier_panel import tier_report
from flowledger.adapters.llm import load_price_table
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from flowledger.projections.tier_queries import TierReport
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres

PRICES = load_price_table()
GO_BUG = json.dumps({"category": "bug_fix", "complexity": "medium", "estimated_hours": 3})


def usage(model: str) -> LlmUsage:
    """A call of 100 input and 20 output tokens on ``model`` at its list price."""
    cost = PRICES.price_for(model).cost(input_tokens=100, output_tokens=20)
    return LlmUsage(
        provider="double",
        request_model=model,
        input_tokens=100,
        output_tokens=20,
        cost_usd=cost,
        price_version=PRICES.version,
    )


def report(engine: Engine) -> TierReport:
    projector = projector_for(engine, batch_size=100)
    projector.catch_up()
    with projector.connect_reader() as conn:  # as GET /v1/dashboard/tiers and the page ask for it
        since = engine.clock() - timedelta(hours=1)
        return tier_report(engine, conn, projector.names.reader, tenant=engine.tenant, since=since)


async def test_the_configured_policy_prices_a_call_at_the_model_the_caller_named(pg_engine: Engine) -> None:
    # Given a medium task (its tier's model deepseek-v3.2) classified on gpt-4.1, named by
    # the caller, and another medium task classified on its tier's model
    engine = pg_engine
    tier_model = engine.classifier.tiers.tiers["medium"][0]
    assert tier_model != "gpt-4.1"
    engine.create_task("named", "Fix the race in the Go worker", priority="medium")
    engine.llm = llm = ScriptedLlm(GO_BUG, usage=usage("gpt-4.1"))
    await engine.classify_task("named", model="gpt-4.1")
    assert llm.calls[-1].model == "gpt-4.1"
    engine.create_task("routed", "Fix the Python importer", priority="medium")
    engine.llm = ScriptedLlm(GO_BUG, usage=usage(tier_model))
    await engine.classify_task("routed")

    # When the what-if prices the recorded calls
    tiers = report(engine)

    # Then the configured policy's cost is what the calls cost (the named call was priced at
    # the tier's model: $0.0000728 for $0.0003964 recorded, a saving shown that was not made),
    # and its row names both models that made the medium calls
    configured = next(p for p in tiers.policies if p.policy == "configured")
    assert tiers.recorded_cost_usd == usage("gpt-4.1").cost_usd + usage(tier_model).cost_usd
    assert configured.cost_usd == tiers.recorded_cost_usd
    assert configured.models == {"medium": ", ".join(sorted(("gpt-4.1", tier_model)))}
    assert configured.unpriced_models == []
    # And the other policies still price every call at their tier's model
    alone = next(p for p in tiers.policies if p.policy == f"all {tier_model}")
    assert alone.cost_usd == usage(tier_model).cost_usd * 2


async def test_the_configured_policy_names_a_model_that_made_calls_and_has_no_price(
    pg_engine: Engine,
) -> None:
    # Given a call on a model the price table cannot price, its cost not known
    engine = pg_engine
    engine.create_task("odd", "Fix the race in the Go worker", priority="medium")
    odd = LlmUsage(provider="double", request_model="house-model-7", input_tokens=100, output_tokens=20)
    engine.llm = ScriptedLlm(GO_BUG, usage=odd)
    await engine.classify_task("odd", model="house-model-7")

    # When the what-if prices it, then the configured policy says which price it lacks
    configured = next(p for p in report(engine).policies if p.policy == "configured")
    assert (configured.cost_usd, configured.saving_pct) == (None, None)
    assert configured.unpriced_models == ["house-model-7"]
