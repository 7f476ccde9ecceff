"""An engine closed while ``process_step`` waits for the model: the caller is told
EngineClosed, as every call another thread is inside when the engine closes is (README: Rules
and errors), not an LlmError about its answer.

Observed: the answer's save was handed to the engine's worker threads, shut down by
``close``, and the caller got ``LlmError: the model answered but its answer could not be
recorded: RuntimeError: cannot schedule new futures after shutdown``: a bug's words for a
closed engine, and an LlmError a caller retries as a model's failure.
"""

from __future__ import annotations

import asyncio

import pytest

from flowledger.domain import EngineClosed
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def test_an_engine_closed_while_the_model_answers_tells_the_step_s_caller_it_is_closed(
    engine: Engine,
) -> None:
    # Given an open session, and a model during whose call the engine is closed
    engine.start_session("s", "wf")
    engine.llm = ScriptedLlm(meanwhile=engine.close)
    # When a step is processed
    with pytest.raises(EngineClosed) as refused:
        asyncio.run(engine.process_step("s", "classify", {"message": "hi"}, idempotency_key="k"))
    # Then the caller is told the engine is closed, in one line
    assert "\n" not in str(refused.value)
    assert refused.value.operation == "process a step"
