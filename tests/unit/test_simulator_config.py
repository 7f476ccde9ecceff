"""``SimulatorConfig`` (and its ``FaultRates``) refuse at construction, naming the field, a value
the simulator cannot serve with: each of these was taken, and then every request failed.

Observed (an outside probe, through the OpenAI SDK): ``latency_sigma="0.5"`` and ``faults=5``
broke every connection ("Unhandled exception in client_connected_cb": a TypeError, an
AttributeError; the client saw only "Connection error"); ``host=5`` was a bare TypeError from
``run_simulator``; ``seed="x"``, ``port=True``, ``latency_sigma=nan``, a negative model latency
or ``cache_min_tokens`` were taken as given.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from flowledger.adapters.simulator import SimulatorConfig
from flowledger.adapters.simulator.replies import FaultRates
from flowledger.domain.errors import ValidationError

REFUSED: list[tuple[str, Any]] = [
    ("host", 5),
    ("host", ""),
    ("port", True),
    ("port", "8089"),
    ("port", 70_000),
    ("port", -1),
    ("latency_sigma", "0.5"),
    ("latency_sigma", math.nan),
    ("latency_sigma", -1),
    ("latency_sigma", math.inf),
    ("latency_ms", True),
    ("model_latency_ms", 5),
    ("model_latency_ms", {"gpt-4.1": -5}),
    ("model_latency_ms", {"gpt-4.1": "45"}),
    ("model_latency_ms", {5: 45.0}),
    ("faults", 5),
    ("cache_min_tokens", -5),
    ("cache_min_tokens", 1.5),
    ("seed", "x"),
    ("seed", 1.5),
    ("seed", True),
]


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_a_value_the_simulator_cannot_serve_with_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        SimulatorConfig(**{field: value})
    assert refused.value.field == field


@pytest.mark.parametrize("rate", ["0.1", True, None], ids=repr)
def test_a_fault_rate_that_is_no_number_is_refused(rate: Any) -> None:
    # ("0.1" was a bare TypeError at the range check.)
    with pytest.raises(ValidationError) as refused:
        FaultRates(rate_limited=rate)
    assert refused.value.field == "faults"


def test_the_usual_settings_are_taken() -> None:
    config = SimulatorConfig(
        host="localhost",
        port=8089,
        latency_ms=0,
        latency_sigma=0,
        model_latency_ms={"gpt-4.1": 30.5},
        faults=FaultRates(rate_limited=0.1),
        cache_min_tokens=0,
        seed=7,
    )
    assert (config.port, config.seed, config.model_latency_ms) == (8089, 7, {"gpt-4.1": 30.5})
