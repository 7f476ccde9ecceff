"""What an Engine is built with (``clock``, ``llm``, ``alerts``) is checked when it is given:
one that cannot be what it stands for is a ValidationError naming it, before anything is
recorded.

Observed: ``Engine.in_memory(clock=5)`` raised ``TypeError: 'int' object is not callable``;
``Engine.in_memory(llm=5)`` (or ``engine.llm = "x"``) was taken, and the first
``process_step`` appended StepStarted and StepFailed, then raised ``AttributeError: 'int'
object has no attribute 'complete'``; ``alerts=5`` was taken too, to fail at a budget's
first alert.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

NOT_COLLABORATORS: list[Any] = [5, "x", [], {}, object(), b"b", True]


@pytest.mark.parametrize("value", NOT_COLLABORATORS, ids=lambda value: type(value).__name__)
@pytest.mark.parametrize("name", ["clock", "llm", "alerts"])
def test_an_engine_built_with_what_is_no_clock_model_or_notifier_is_refused_naming_it(
    name: str, value: Any
) -> None:
    with pytest.raises(ValidationError) as refused:
        Engine.in_memory(**{name: value})
    assert refused.value.field == name


@pytest.mark.parametrize("value", NOT_COLLABORATORS, ids=lambda value: type(value).__name__)
def test_an_llm_set_on_an_engine_that_is_no_adapter_is_refused_and_nothing_is_recorded(value: Any) -> None:
    # Given an engine with a model and a session
    with Engine.in_memory(llm=ScriptedLlm()) as engine:
        engine.start_session("s", "wf")
        before = engine.log.head()
        # When its model is replaced by what is no adapter
        with pytest.raises(ValidationError) as refused:
            engine.llm = value
        # Then it is refused, the adapter kept, and a step still calls it
        assert refused.value.field == "llm"
        asyncio.run(engine.process_step("s", "a", {"m": 1}))
        assert engine.log.head() == before + 2  # StepStarted, StepProcessed


def test_a_clock_model_and_notifier_of_the_right_shape_are_taken() -> None:
    class Notifier:
        def notify(self, alert: object, secret: str | None) -> None: ...

        async def aclose(self) -> None: ...

    with Engine.in_memory(llm=ScriptedLlm(), alerts=Notifier()) as engine:
        assert engine.llm is not None
