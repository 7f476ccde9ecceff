"""An idempotency key that is not a name is a ValidationError naming ``idempotency_key``, checked
before any lookup of the key: the same answer with or without keyed steps, nothing appended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

NOT_KEYS: list[Any] = [5, 0, 1.5, True, ["x"], [], {"k": 1}, b"k", "", "   ", "a\x00b"]


def keyed_session(engine: Engine, session_id: str) -> int:
    """A session with a step recorded under a key (so a key lookup has a filter to ask)."""
    engine.start_session(session_id, "wf")
    engine.record_step(session_id, "a", idempotency_key="k1")
    return engine.get_session(session_id).version


@pytest.mark.parametrize("key", NOT_KEYS, ids=repr)
def test_record_step_refuses_a_key_that_is_not_a_name_on_a_session_with_keyed_steps(
    engine: Engine, key: Any
) -> None:
    # Given a session whose state holds keys
    version = keyed_session(engine, "s1")
    # When a step comes with a key that is no name
    with pytest.raises(ValidationError) as raised:
        engine.record_step("s1", "a", idempotency_key=key)
    # Then it is refused as bad input, and nothing is appended
    assert raised.value.field == "idempotency_key"
    assert engine.get_session("s1").version == version


@pytest.mark.parametrize("key", NOT_KEYS, ids=repr)
def test_process_step_refuses_a_key_that_is_not_a_name_and_calls_no_model(engine: Engine, key: Any) -> None:
    # Given a session whose state holds keys, and a model
    version = keyed_session(engine, "s1")
    engine.llm = llm = ScriptedLlm()
    # When a step is processed under a key that is no name (falsy ones too: no fresh key is made)
    with pytest.raises(ValidationError) as raised:
        asyncio.run(engine.process_step("s1", "a", idempotency_key=key))
    # Then it is refused before the model is called, and nothing is appended
    assert raised.value.field == "idempotency_key"
    assert llm.calls == []
    assert engine.get_session("s1").version == version
