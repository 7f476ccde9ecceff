"""The OpenAI-compatible LLM simulator: a real HTTP server for demos, tests and benchmarks.

Its names are imported on first use (PEP 562): ``replies`` (the configuration) loads without
the web server, so commands that only check a configuration start without aiohttp.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowledger.adapters.simulator.replies import FaultRates, SimulatorConfig
    from flowledger.adapters.simulator.server import Exchange, Simulator, run_simulator

_EXPORTS = {
    "Exchange": "flowledger.adapters.simulator.server",
    "FaultRates": "flowledger.adapters.simulator.replies",
    "Simulator": "flowledger.adapters.simulator.server",
    "SimulatorConfig": "flowledger.adapters.simulator.replies",
    "run_simulator": "flowledger.adapters.simulator.server",
}


def __getattr__(name: str) -> Any:
    """The exported name, imported from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Exchange", "FaultRates", "Simulator", "SimulatorConfig", "run_simulator"]
