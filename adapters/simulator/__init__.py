"""The OpenAI-compatible LLM simulator: a real HTTP server for demos, tests and benchmarks.

Its names are imported on first use (PEP 562): ``replies`` (the configuration) loads without
the web server, so commands that only check a configuration start without aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowledger.adapters.lazy_exports import lazy_exports

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


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)


__all__ = ["Exchange", "FaultRates", "Simulator", "SimulatorConfig", "run_simulator"]
