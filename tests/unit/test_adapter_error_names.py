"""A failure is recorded whatever the LLM adapter called it.

A custom adapter (the ``LlmPort`` a user plugs in) raising an ``LlmError`` whose
``error_type`` held a NUL, or a line break, made ``process_step`` refuse its own failure
record: the caller got a ``ValidationError`` about the adapter's error and the step stayed
pending until its lease lapsed. The failure is now recorded with the name made storable.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from flowledger.domain.bounds import require_name, storable_name
from flowledger.domain.errors import LlmError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm


@pytest.mark.parametrize("error_type", ["quota\x00exceeded", "rate\nlimited", "\u200b", "x" * 300, ""])
async def test_an_adapters_odd_error_type_is_recorded_as_a_failure_not_refused(error_type: str) -> None:
    llm = ScriptedLlm(error=LlmError("the provider said no", error_type=error_type, attempts=1))
    with Engine(settings=make_settings(database_url="memory:"), llm=llm) as engine:
        engine.start_session("s1", "cs")
        # When the adapter fails with an error type no name may hold
        with pytest.raises(LlmError):
            await engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="k1")
        # Then the failure is recorded under the key and nothing stays pending
        state = engine.get_session("s1")
        assert state.pending == ()
        [failure] = state.failures
        assert require_name("error_type", failure.error_type) == failure.error_type
        assert failure.error_message == "the provider said no"


async def test_an_adapters_failure_with_usage_past_its_bounds_is_recorded_within_them() -> None:
    usage = replace(USAGE, request_model="m\x00odel")
    llm = ScriptedLlm(error=LlmError("boom", error_type="server_error", attempts=1, usage=usage))
    with Engine(settings=make_settings(database_url="memory:"), llm=llm) as engine:
        engine.start_session("s1", "cs")
        with pytest.raises(LlmError):
            await engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="k1")
        state = engine.get_session("s1")
        assert state.pending == ()
        assert len(state.failures) == 1


def test_a_storable_name_keeps_a_good_name_and_replaces_what_a_name_may_not_hold() -> None:
    assert storable_name("rate_limited", "unknown") == "rate_limited"
    assert storable_name("a\x00b", "unknown") == "a\ufffdb"
    assert storable_name("\u200b", "unknown") == "unknown"
    assert storable_name(5, "unknown") == "unknown"
    assert len(storable_name("y" * 500, "unknown")) == 200
