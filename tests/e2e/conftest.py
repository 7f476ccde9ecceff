"""The e2e tests' model: the built-in simulator, which they call through the real client
(``tests/support/simulated.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowledger.adapters.simulator import Simulator, SimulatorConfig, run_simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    """The simulator on loopback, no latency and no faults (a module may define its own)."""
    with run_simulator(SimulatorConfig(latency_ms=0, seed=18)) as running:
        yield running
