"""A budget set through one engine holds for every call another engine makes after the set
returned, though that engine had just seen the tenant without budgets (and keeps such an
answer for ``NO_BUDGETS_CACHE_S``, so that its steps pay no query meanwhile)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from tests.integration.test_budgets import MODEL, client, step

pytestmark = pytest.mark.postgres


@pytest.fixture
def settings(database_url: str, pg_schema: str) -> Settings:
    return Settings(home=Path("/nonexistent"), database_url=database_url, schema=pg_schema)


@pytest.fixture
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=5, seed=5)) as running:
        yield running


async def test_a_budget_set_elsewhere_charges_every_call_made_after_the_set_returned(
    settings: Settings, simulator: Any
) -> None:
    here = Engine(settings=settings, llm=client(simulator.base_url))
    there = Engine(settings=settings)
    try:
        here.start_session("s", "support")
        # Given an engine that has just seen the tenant without budgets (its step asked)
        assert await step(here, "s", 0) == "done"
        assert here.budgets.known_idle()
        # When another sets an enforced $1 budget on the workflow
        there.budgets.set("workflow", "support", "day", "1")
        # Then a step recorded here right after is charged to it ($0 before: the engine
        # still took the tenant for one without budgets, for up to a second)
        usage = LlmUsage(request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.9"))
        here.record_step("s", "recorded", usage=usage, idempotency_key="r")
        [burn] = there.budgets.burn()
        assert burn.spent_usd == Decimal("0.9")
        # And a model call here is held against it: refused, as it could cost more than $0.10
        assert await step(here, "s", 1) == "refused"
    finally:
        await here.aclose()
        await there.aclose()


def test_a_set_waits_for_no_engine_that_has_not_just_seen_the_tenant_without_budgets(
    settings: Settings,
) -> None:
    one = Engine(settings=settings)
    try:
        # Given no engine asked whether the tenant has budgets, or only the one setting it
        started = time.monotonic()
        one.budgets.set("workflow", "support", "day", "1")
        one.budgets.remove("workflow", "support", "day")
        assert one.budgets.active() is False
        one.budgets.set("workflow", "support", "day", "1")
        # Then the sets did not wait for anything
        assert time.monotonic() - started < 0.9
    finally:
        one.close()
