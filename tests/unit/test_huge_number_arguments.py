"""A number too large for Python to write out (an int of more than 4,300 digits) or to make a
float of (past 1.8e308) given where a count, a version, a capacity or a usage figure goes is a
ValidationError naming the field, like any other number out of range: the message that refused
it wrote the number with ``repr``, which raised ``ValueError`` ("Exceeds the limit (4300 digits)
for integer string conversion"), and the latency check's ``math.isfinite`` ``OverflowError``
("int too large to convert to float"), to the caller instead of the refusal."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine

TOO_LONG = 10**5000
"""More digits than ``str`` (and so ``repr``) of an int will write."""
PAST_FLOAT = 2**1100
"""Fewer digits (332), but no float holds it."""


def _usage(**fields: Any) -> Callable[[Engine], object]:
    return lambda engine: engine.record_step("s", "step", usage=LlmUsage(request_model="m", **fields))


CALLS: dict[str, tuple[str, Callable[[Engine], object]]] = {
    "session version": ("version", lambda engine: engine.get_session("s", version=TOO_LONG)),
    "fork version": ("at_version", lambda engine: engine.fork_session("s", TOO_LONG, "s-2")),
    "task version": ("version", lambda engine: engine.get_task("t", version=TOO_LONG)),
    "agent version": ("version", lambda engine: engine.get_agent("a", version=TOO_LONG)),
    "agent capacity": ("capacity", lambda engine: engine.set_agent_capacity("a", TOO_LONG)),
    "new agent capacity": ("capacity", lambda engine: engine.register_agent("b", "B", ["x"], TOO_LONG)),
    "input tokens": ("usage.input_tokens", _usage(input_tokens=TOO_LONG)),
    "attempts": ("usage.attempts", _usage(attempts=TOO_LONG)),
    "cost as an int": ("usage.cost_usd", _usage(cost_usd=TOO_LONG)),
    "latency too long to write": ("usage.latency_ms", _usage(latency_ms=TOO_LONG)),
    "latency past a float": ("usage.latency_ms", _usage(latency_ms=PAST_FLOAT)),
}


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_a_number_too_large_to_write_out_is_refused_naming_its_field(engine: Engine, call: str) -> None:
    # Given a session, a task and an agent
    engine.start_session("s", "wf")
    engine.create_task("t", "something")
    engine.register_agent("a", "A", ["x"])
    before = len(engine.history("s"))
    field, command = CALLS[call]
    # When a figure no int or float of the kind can be is given
    with pytest.raises(ValidationError) as refused:
        command(engine)
    # Then it is refused naming the field and its bound, and nothing is recorded
    assert refused.value.field == field
    assert any(words in refused.value.message for words in ("digits", "at most", "versions, not"))
    assert len(engine.history("s")) == before


def test_a_cost_given_as_an_int_too_long_to_write_names_its_size() -> None:
    with pytest.raises(ValidationError) as refused:
        LlmUsage(cost_usd=TOO_LONG)  # type: ignore[arg-type]
    assert refused.value.field == "usage.cost_usd"
    assert "5,001 digits" in refused.value.message
    assert Decimal(1) == LlmUsage(cost_usd=Decimal(1)).cost_usd
