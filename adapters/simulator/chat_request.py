"""What a chat-completions request asks the simulator, checked as OpenAI checks it.

Every field the simulator reads is checked for its JSON type before use, so a malformed
request is a 400 ``BadRequest`` that names the field (``param``), as OpenAI answers it. The
common path is one ``type()`` test a field and one combined test a message (about 1 µs a
request beside ``json.loads``' 4 to 5); the exact complaint is worked out only on refusal.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from flowledger.adapters.simulator.replies import FAULTS, MAX_LATENCY_MS
from flowledger.adapters.simulator.wire import BadRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_CHOICES = 128
"""The most choices (``n``) a request may ask for, as OpenAI allows."""
# json.loads builds exactly these types, so ``type(x) in`` is the whole check, and cheap.
_CONTENT_TYPES = frozenset({str, list})
_NUMBER_TYPES = frozenset({int, float})


class ChatRequest(NamedTuple):
    """The fields of a request body that the simulator acts on (a tuple: built on every
    request, and a frozen dataclass costs about 1 µs more)."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    """The smaller of ``max_tokens`` and ``max_completion_tokens``, when either is given."""
    n: int


def chat_request(raw: bytes) -> ChatRequest:
    """The request in ``raw`` (a JSON body), or a ``BadRequest`` naming what is wrong."""
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        raise BadRequest("We could not parse the JSON body of your request.") from None
    if type(request) is not dict:
        raise BadRequest(f"The request body must be a JSON object, got {_kind(request)}.")
    model = request.get("model")
    if type(model) is not str:
        raise _invalid_type("model", "a string", model)
    messages = request.get("messages")
    if type(messages) is not list:
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        raise BadRequest(
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
            param="messages",
            code="empty_array",
        )
    for index, message in enumerate(messages):
        # One test per message on the common path; _message_refusal works out what is wrong.
        if not (
            type(message) is dict
            and type(role := message.get("role")) is str
            and role in ROLES
            # Only an assistant's message (carrying tool calls) may leave its content out.
            and (
                type(content := message.get("content")) in _CONTENT_TYPES
                or (content is None and role == "assistant")
            )
        ):
            raise _message_refusal(index, message)
    stream = request.get("stream")
    if stream is not None and type(stream) is not bool:  # "false" is a non-empty string: truthy
        raise _invalid_type("stream", "a boolean", stream)
    options = request.get("stream_options")
    if options is not None and type(options) is not dict:
        raise _invalid_type("stream_options", "an object", options)
    include_usage = options.get("include_usage") if options else None
    if include_usage is not None and type(include_usage) is not bool:
        raise _invalid_type("stream_options.include_usage", "a boolean", include_usage)
    cap = request.get("max_tokens")
    if cap is not None and not (type(cap) is int and cap >= 1):
        raise _count_refusal("max_tokens", cap)
    newer = request.get("max_completion_tokens")
    if newer is not None:
        if not (type(newer) is int and newer >= 1):
            raise _count_refusal("max_completion_tokens", newer)
        cap = newer if cap is None else min(cap, newer)
    temperature = request.get("temperature")
    if temperature is not None and not (type(temperature) in _NUMBER_TYPES and 0 <= temperature <= 2):
        raise _temperature_refusal(temperature)
    n = request.get("n")
    if n is None:
        n = 1
    elif not (type(n) is int and 1 <= n <= MAX_CHOICES):
        raise _count_refusal("n", n, MAX_CHOICES)
    return ChatRequest(model, messages, stream is True, include_usage is True, cap, n)


def _count_refusal(name: str, value: Any, most: int | None = None) -> BadRequest:
    """Why ``value`` is not a whole number from 1 (to ``most``)."""
    if type(value) is not int:  # nor bool, which isinstance takes for an int
        return _invalid_type(name, "an integer", value)
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


def _temperature_refusal(value: Any) -> BadRequest:
    """Why ``value`` is not a temperature OpenAI takes (a number from 0 to 2)."""
    if type(value) not in _NUMBER_TYPES:  # nor bool
        return _invalid_type("temperature", "a decimal", value)
    if not value <= 2:  # NaN too (json.loads reads it)
        side, expected, code = "above maximum", "<= 2", "decimal_above_max_value"
    else:
        side, expected, code = "below minimum", ">= 0", "decimal_below_min_value"
    return BadRequest(
        f"Invalid 'temperature': decimal {side} value. Expected a value {expected}, but got {value} instead.",
        param="temperature",
        code=code,
    )


def _message_refusal(index: int, message: Any) -> BadRequest:
    where = f"messages[{index}]"
    if type(message) is not dict:
        return _invalid_type(where, "an object", message)
    role = message.get("role")
    if role is None:
        return _missing(f"{where}.role")
    if type(role) is not str:
        return _invalid_type(f"{where}.role", "a string", role)
    if role not in ROLES:
        supported = ", ".join(f"'{r}'" for r in sorted(ROLES))
        return BadRequest(
            f"Invalid value: {role[:40]!r}. Supported values are: {supported}.",
            param=f"{where}.role",
            code="invalid_value",
        )
    if message.get("content") is None:
        return _missing(f"{where}.content")
    return _invalid_type(f"{where}.content", "a string or an array of objects", message.get("content"))


def latency_override_ms(headers: dict[str, str]) -> float | None:
    """``x-sim-latency-ms``: a mean latency from 0 to ``MAX_LATENCY_MS``, or None when absent
    (beyond it a 400: a request asking for more would hang, not simulate anything)."""
    given = headers.get("x-sim-latency-ms")
    if not given:
        return None
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_LATENCY_MS:  # NaN fails both
        raise BadRequest(
            f"x-sim-latency-ms must be a number of milliseconds from 0 to {MAX_LATENCY_MS:,.0f}, "
            f"got {given[:40]!r}",
            param="x-sim-latency-ms",
            code="invalid_value",
        )
    return value


def fault_override(headers: dict[str, str]) -> str | None:
    """``x-sim-fault``: one of ``FAULTS``, or None when absent."""
    given = headers.get("x-sim-fault")
    if not given:
        return None
    if given not in FAULTS:
        raise BadRequest(
            f"x-sim-fault must be one of {', '.join(FAULTS)}, got {given[:40]!r}",
            param="x-sim-fault",
            code="invalid_value",
        )
    return given


def _invalid_type(param: str, expected: str, got: Any) -> BadRequest:
    if got is None and "." not in param and "[" not in param:
        return _missing(param)
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(got)} instead.",
        param=param,
        code="invalid_type",
    )


def _missing(param: str) -> BadRequest:
    message = f"Missing required parameter: '{param}'."
    return BadRequest(message, param=param, code="missing_required_parameter")


def _kind(value: Any) -> str:
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
