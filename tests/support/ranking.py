"""Engines with routing's ``model_ranked_matching`` on (``infrastructure/ranking.py``), for the
tests of the model's tie-break between agents the rule cannot tell apart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowledger.infrastructure import Engine
from tests.conftest import backend_engine

ROUTING = Path(__file__).resolve().parents[2] / "infrastructure" / "routing.json"
"""The shipped routing rules."""


def ranked_routing(directory: Path) -> Path:
    """A copy of the shipped routing rules in ``directory`` with ``model_ranked_matching`` on."""
    data = json.loads(ROUTING.read_text())
    data["model_ranked_matching"] = True
    path = directory / "routing.json"
    path.write_text(json.dumps(data))
    return path


def two_golang_agents(request: pytest.FixtureRequest, directory: Path, capacity: int) -> Iterator[Engine]:
    """For a fixture parametrized ``["memory", "postgres"]``: an engine ranking by model, with
    agents ann and bob, both golang and of ``capacity``, closed afterwards."""
    for engine in backend_engine(request, routing_file=ranked_routing(directory)):
        engine.register_agent("ann", "Ann", ["golang"], capacity)
        engine.register_agent("bob", "Bob", ["golang"], capacity)
        yield engine
