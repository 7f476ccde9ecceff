"""Tasks classified through the real HTTP client against the built-in simulator, on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowledger.adapters.llm import OpenAICompatibleClient
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.adapters.simulator.replies import task_classification
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


@pytest.fixture
def simulated_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    with run_simulator(SimulatorConfig(latency_ms=5, seed=7)) as simulator:
        settings = make_settings(
            database_url=database_url,
            schema=pg_schema,
            llm_base_url=simulator.base_url,
            llm_api_key="sk-test-0000",
        )
        engine = Engine(settings=settings, llm=OpenAICompatibleClient.from_settings(settings))
        yield engine
        engine.close()


async def test_a_task_classified_through_the_simulator_keeps_the_calls_usage(
    simulated_engine: Engine,
) -> None:
    engine = simulated_engine
    engine.create_task("T-1", "Fix the race in the Go worker pool", ["golang"], "high")

    state = await engine.classify_task("T-1", model="deepseek-v3.2")

    assert state.classification is not None
    assert (state.classification.category, state.classification.complexity) == ("bug_fix", "high")
    usage = state.classification.usage
    assert usage is not None
    assert usage.request_model == "deepseek-v3.2"
    assert usage.input_tokens > 0
    assert usage.output_tokens > 0
    assert usage.cost_usd > 0
    events = [e.event_type for e in engine.task_history("T-1")]
    assert events == ["Task.Created", "Task.Classified"]
    await engine.aclose()


@pytest.mark.parametrize(
    ("text", "category", "complexity"),
    [
        ("Write the runbook docs for the deploy", "documentation", "low"),
        ("Investigate p99 latency and compare drivers", "research", "medium"),
        ("Production down: security patch for the API", "feature", "critical"),
        ("Roll out the new helm chart", "deployment", "medium"),
    ],
)
def test_the_simulator_classifies_by_keywords(text: str, category: str, complexity: str) -> None:
    reply = task_classification(text)
    assert (reply["category"], reply["complexity"]) == (category, complexity)
    assert reply["estimated_hours"] > 0
