"""The official OpenAI SDK against a simulator of the test's own: how the simulator's OpenAI
compatibility is checked (tool calls, stop sequences, log probabilities, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import openai

from flowledger.adapters.simulator import SimulatorConfig, run_simulator


@contextmanager
def sdk_on_simulator(seed: int = 3) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` client (no retries, 5 s timeout) on a simulator that answers at once."""
    with (
        run_simulator(SimulatorConfig(latency_ms=0, seed=seed)) as simulator,
        openai.OpenAI(base_url=simulator.base_url, api_key="sk-sim-000000", max_retries=0, timeout=5) as sdk,
    ):
        yield sdk
