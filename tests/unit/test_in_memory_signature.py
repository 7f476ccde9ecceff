"""``Engine.in_memory`` takes the constructor's keyword options by name and type, so a type
checker holds a caller to them: it took ``**kwargs: Any``, and ``Engine.in_memory(tenant=5,
clok=...)`` type-checked under ``mypy --strict`` (the misspelt name failed at run time only;
``database_url=`` with "got multiple values")."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import get_type_hints

import pytest

from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def test_in_memory_names_and_types_every_keyword_option_of_the_constructor() -> None:
    # Given the constructor's keyword-only options, with their types
    built = inspect.signature(Engine.__init__).parameters
    options = {name for name, p in built.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    hints = get_type_hints(Engine.__init__)
    # When in_memory's parameters are read
    taken = inspect.signature(Engine.in_memory).parameters
    in_memory_hints = get_type_hints(Engine.in_memory)
    # Then it takes the same options, keyword-only, with the same types, and nothing else
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values())
    assert set(taken) == options
    for name in options:
        assert taken[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert in_memory_hints[name] == hints[name], name
    assert in_memory_hints["return"] is Engine


def test_in_memory_passes_its_options_on() -> None:
    moment = datetime(2026, 12, 5, tzinfo=UTC)
    llm = ScriptedLlm()
    with Engine.in_memory(tenant="acme", clock=lambda: moment, llm=llm) as engine:
        assert (engine.tenant, engine.clock(), engine.llm) == ("acme", moment, llm)
        assert engine.database_url == "memory:"


def test_in_memory_refuses_a_database_url_as_an_unknown_option() -> None:
    with pytest.raises(TypeError, match="database_url"):
        Engine.in_memory(database_url="postgresql://x")  # type: ignore[call-arg]
