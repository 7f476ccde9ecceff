"""The simulator's 400 answers in OpenAI's words: a field of the wrong type, missing, out of
range or not one of the values it takes (``param`` and ``code`` as OpenAI sets them)."""

from __future__ import annotations

from typing import Any

from flowledger.adapters.simulator.wire import BadRequest


def decimal_refusal(name: str, value: Any, side: str, expected: str, code: str) -> BadRequest:
    return BadRequest(
        f"Invalid '{name}': decimal {side} value. Expected a value {expected}, but got {value} instead.",
        param=name,
        code=code,
    )


def invalid_value(param: str, value: Any, supported: tuple[str, ...]) -> BadRequest:
    names = ", ".join(f"'{choice}'" for choice in supported)
    return BadRequest(
        f"Invalid value: {str(value)[:40]!r}. Supported values are: {names}.",
        param=param,
        code="invalid_value",
    )


def count_refusal(name: str, value: Any, most: int | None = None) -> BadRequest:
    """Why ``value`` is not a whole number from 1 (to ``most``)."""
    if type(value) is not int:  # nor bool, which isinstance takes for an int
        return invalid_type(name, "an integer", value)
    if value < 1:
        return BadRequest(
            f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got {value} instead.",
            param=name,
            code="integer_below_min_value",
        )
    return BadRequest(
        f"Invalid '{name}': integer above maximum value. Expected a value <= {most}, "
        f"but got {value} instead.",
        param=name,
        code="integer_above_max_value",
    )


def invalid_type(param: str, expected: str, got: Any) -> BadRequest:
    if got is None and "." not in param and "[" not in param:
        return missing(param)
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {kind(got)} instead.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> BadRequest:
    message = f"Missing required parameter: '{param}'."
    return BadRequest(message, param=param, code="missing_required_parameter")


def kind(value: Any) -> str:
    """The JSON type of ``value``, as OpenAI's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def check_length(param: str, value: str, most: int) -> None:
    """Refuse ``value`` when it is longer than ``most`` characters."""
    if len(value) > most:
        raise BadRequest(
            f"Invalid '{param}': string too long. Expected a string with maximum length {most}, "
            f"but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )
