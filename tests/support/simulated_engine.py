"""An engine on the test's PostgreSQL schema whose model calls go to the built-in simulator, and
the one-cent call the grouping tests record beside its calls."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.simulated import simulated_client

ONE_CENT_CALL = LlmUsage(
    provider="p",
    request_model="gpt-4.1",
    response_model="gpt-4.1",
    input_tokens=10,
    output_tokens=5,
    cost_usd=Decimal("0.01"),
    latency_ms=5.0,
)
"""A gpt-4.1 call of 10 + 5 tokens that cost $0.01."""


@contextmanager
def simulated_engine(database_url: str, schema: str) -> Iterator[Engine]:
    """An engine on ``schema`` calling a simulator (no latency, seed 3) that runs meanwhile."""
    with run_simulator(SimulatorConfig(latency_ms=0, seed=3)) as simulator:
        engine = Engine(
            settings=make_settings(database_url=database_url, schema=schema),
            llm=simulated_client(simulator.base_url),
        )
        try:
            yield engine
        finally:
            engine.close()
