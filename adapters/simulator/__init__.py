"""The OpenAI-compatible LLM simulator: a real HTTP server for demos, tests and benchmarks."""

from flowledger.adapters.simulator.replies import FaultRates, SimulatorConfig
from flowledger.adapters.simulator.server import Exchange, Simulator, run_simulator

__all__ = ["Exchange", "FaultRates", "Simulator", "SimulatorConfig", "run_simulator"]
