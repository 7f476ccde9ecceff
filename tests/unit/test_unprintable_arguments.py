"""An argument Python cannot write out (an int of more than 4,300 digits, a dict or list nested
thousands deep) is refused as any other wrong value is: a ``FlowledgerError`` naming it, in one
line, nothing appended.

A refusal quotes what it refused, and ``repr`` of such a value raises: ``ValueError: Exceeds
the limit (4300 digits) for integer string conversion`` or ``RecursionError: maximum recursion
depth exceeded while getting the repr of an object`` reached the caller of ``start_session(ttl=
10**5000)``, ``register_agent(skills=<nested dict>)``, ``requeue_task(reason=...)`` and some
sixty other method and argument pairs in place of the refusal.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from flowledger.domain.bounds import shown
from flowledger.domain.errors import FlowledgerError
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.property.test_hostile_arguments import METHODS, START, _call, _given, _valid_arguments
from tests.support.llm import ScriptedLlm


def _nested_dict(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    inner = root
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return root


def _nested_list(depth: int) -> list[Any]:
    root: list[Any] = []
    inner = root
    for _ in range(depth):
        inner.append([])
        inner = inner[-1]
    return root


UNPRINTABLE: dict[str, Any] = {
    "int-of-5001-digits": 10**5000,
    "dict-nested-2000-deep": _nested_dict(2_000),
    "list-nested-5000-deep": _nested_list(5_000),
    "int-of-5001-digits-in-a-dict": {"x": 10**5000},
    "list-nested-3000-deep-in-a-dict": {"x": _nested_list(3_000)},
}
"""Values whose ``repr`` (and ``str``) raises."""


@pytest.mark.parametrize("name", METHODS)
def test_an_argument_python_cannot_write_out_is_refused_in_one_line_appending_nothing(name: str) -> None:
    # Given an open, a completed and an expired session, a task and an agent, per call
    now = [START]
    args = _valid_arguments()
    with Engine(
        settings=make_settings(database_url="memory:"), clock=lambda: now[0], llm=ScriptedLlm()
    ) as engine:
        for n, parameter in enumerate(sorted(args.get(name, {}))):
            for label, value in UNPRINTABLE.items():
                tag = f"-{n}-{label}"
                given = _valid_arguments(tag)[name]
                given[parameter] = value
                _given(engine, now, tag)
                now[0] += timedelta(seconds=10)
                before = engine.log.head()
                # When one argument is such a value
                try:
                    refused = _call(engine, name, given)
                except (ValueError, RecursionError) as error:
                    pytest.fail(f"{name}({parameter}={label}): {type(error).__name__}: {error}")
                # Then it is answered, or refused in one line with nothing appended
                if refused is not None:
                    assert "\n" not in str(refused), str(refused)
                    assert engine.log.head() == before, f"{name}({parameter}={label}) appended"


@pytest.mark.parametrize("label", sorted(UNPRINTABLE))
def test_a_usage_holding_such_a_value_is_refused_naming_its_field(label: str) -> None:
    # When a usage is made with such a value where a name, a list of names, a cost or a flag goes
    for field in ("provider", "finish_reasons", "cost_usd", "unpriced"):
        # Then it is a FlowledgerError naming the field
        with pytest.raises(FlowledgerError, match=f"usage.{field}"):
            LlmUsage(**{field: UNPRINTABLE[label]})


@pytest.mark.parametrize("label", sorted(UNPRINTABLE))
def test_shown_writes_out_any_value_in_one_line(label: str) -> None:
    # When such a value is shown in a message
    text = shown(UNPRINTABLE[label])
    # Then it is a short line saying what it is, not an error
    assert "\n" not in text, text
    assert len(text) < 200, text


def test_shown_still_writes_plain_values_as_repr_does() -> None:
    for value in ("a'b", 5, None, [1, {"a": 2.5}], datetime(2026, 1, 1), 10**4000):
        assert shown(value) == repr(value)
