"""The fields of a chat-completions request the simulator takes but does not read (sampling,
tools, metadata, reasoning and the like), each checked as OpenAI checks it (``CHECKS``)."""

from __future__ import annotations

import re
from typing import Any

from flowledger.adapters.simulator.refusals import (
    check_length,
    count_refusal,
    decimal_refusal,
    invalid_type,
    invalid_value,
    missing,
)
from flowledger.adapters.simulator.replies import thinks
from flowledger.adapters.simulator.tool_calls import check_name
from flowledger.adapters.simulator.wire import BadRequest

MAX_STOPS = 4
"""The most stop sequences a request may give, as OpenAI allows."""
MAX_TOP_LOGPROBS = 20
_RESPONSE_FORMATS = ("json_object", "json_schema", "text")
SERVED_TIERS = {
    "auto": "default",
    "default": "default",
    "flex": "flex",
    "scale": "scale",
    "priority": "priority",
    "fast": "priority",
}
"""The ``service_tier`` a reply says served it, by the one asked for (``default`` when none is):
OpenAI's reply names the tier used, ``auto`` the project's (``default`` unless set otherwise),
and ``fast`` is shown as ``priority``. The simulator's replies had none, read as None by the SDK."""
_TOOL_CHOICES = ("auto", "none", "required")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""The ``reasoning_effort`` values OpenAI names (the official SDK's ``ReasoningEffort``)."""
# json.loads builds exactly these types, so ``type(x) in`` is the whole check, and cheap.
NUMBER_TYPES = frozenset({int, float})


def _number_within(least: float, most: float) -> Any:
    def check(name: str, value: Any, _request: dict[str, Any]) -> None:
        if type(value) not in NUMBER_TYPES:  # nor bool
            raise invalid_type(name, "a decimal", value)
        if not value <= most:  # NaN too (json.loads reads it)
            raise decimal_refusal(name, value, "above maximum", f"<= {most:g}", "decimal_above_max_value")
        if not value >= least:
            raise decimal_refusal(name, value, "below minimum", f">= {least:g}", "decimal_below_min_value")

    return check


def _of_type(kind: type, expected: str) -> Any:
    def check(name: str, value: Any, _request: dict[str, Any]) -> None:
        if type(value) is not kind:  # a bool is not an int here
            raise invalid_type(name, expected, value)

    return check


def _check_top_logprobs(name: str, value: Any, request: dict[str, Any]) -> None:
    if not (type(value) is int and 0 <= value <= MAX_TOP_LOGPROBS):
        if type(value) is int and value < 0:
            raise BadRequest(
                f"Invalid '{name}': integer below minimum value. "
                f"Expected a value >= 0, but got {value} instead.",
                param=name,
                code="integer_below_min_value",
            )
        raise count_refusal(name, value, MAX_TOP_LOGPROBS)
    if request.get("logprobs") is not True:
        raise BadRequest(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is given.",
            param=name,
            code="invalid_value",
        )


def _check_stop(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is str:
        return
    if type(value) is not list:
        raise invalid_type(name, "a string or an array of strings", value)
    if len(value) > MAX_STOPS:
        raise BadRequest(
            f"Invalid '{name}': array too long. Expected an array with maximum length {MAX_STOPS}, "
            f"but got an array with length {len(value)} instead.",
            param=name,
            code="array_above_max_length",
        )
    for index, item in enumerate(value):
        if type(item) is not str:
            raise invalid_type(f"{name}[{index}]", "a string", item)


def _check_response_format(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not dict:
        raise invalid_type(name, "an object", value)
    kind = value.get("type")
    if kind is None:
        raise missing(f"{name}.type")
    if kind not in _RESPONSE_FORMATS:
        raise invalid_value(f"{name}.type", kind, _RESPONSE_FORMATS)
    if kind == "json_schema" and type(value.get("json_schema")) is not dict:
        if value.get("json_schema") is None:
            raise missing(f"{name}.json_schema")
        raise invalid_type(f"{name}.json_schema", "an object", value.get("json_schema"))
    if kind == "json_schema":
        # Its name is required and named as a function is: left out or "step decision", it
        # was answered 200, and the SDK's callers that build the format by hand failed at OpenAI.
        schema_name = value["json_schema"].get("name")
        if type(schema_name) is not str:
            if schema_name is None:
                raise missing(f"{name}.json_schema.name")
            raise invalid_type(f"{name}.json_schema.name", "a string", schema_name)
        check_name(f"{name}.json_schema.name", schema_name)


def _check_logit_bias(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not dict:
        raise invalid_type(name, "an object", value)
    for token, bias in value.items():
        if not (token.isascii() and token.isdigit() and type(bias) in NUMBER_TYPES and -100 <= bias <= 100):
            raise BadRequest(
                f"Invalid '{name}': each key must be a token id and each value a number from -100 to 100, "
                f"got {token[:20]!r}: {str(bias)[:20]}.",
                param=name,
                code="invalid_value",
            )


def _check_tools(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not list:
        raise invalid_type(name, "an array of objects", value)
    for index, tool in enumerate(value):
        if type(tool) is not dict:
            raise invalid_type(f"{name}[{index}]", "an object", tool)


def _check_service_tier(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not str:
        raise invalid_type(name, "a string", value)
    if value not in SERVED_TIERS:
        raise invalid_value(name, value, tuple(SERVED_TIERS))


def _check_tool_choice(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is dict:
        return
    if type(value) is not str:
        raise invalid_type(name, "a string or an object", value)
    if value not in _TOOL_CHOICES:
        raise invalid_value(name, value, _TOOL_CHOICES)


def _check_reasoning_effort(name: str, value: Any, request: dict[str, Any]) -> None:
    """A thinking model's effort, one OpenAI names; a model that does not think refuses the
    field, as OpenAI's gpt-4.1 does (it was answered 200, whatever it held, for any model)."""
    if type(value) is not str:
        raise invalid_type(name, "a string", value)
    if not thinks(request["model"]):
        raise BadRequest(
            f"Unsupported parameter: '{name}' is not supported with this model.",
            param=name,
            code="unsupported_parameter",
        )
    if value not in REASONING_EFFORTS:
        raise invalid_value(name, value, REASONING_EFFORTS)


MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
"""``metadata``: at most 16 pairs, keys of at most 64 characters, string values of at most 512."""
MAX_SAFETY_IDENTIFIER = 128


def _check_metadata(name: str, value: Any, _request: dict[str, Any]) -> None:
    """OpenAI's metadata: string values, within its bounds (``{"order": 1001}`` was answered 200)."""
    if type(value) is not dict:
        raise invalid_type(name, "an object", value)
    if len(value) > MAX_METADATA_PAIRS:
        raise BadRequest(
            f"Invalid '{name}': too many properties. Expected an object with at most {MAX_METADATA_PAIRS}"
            f" properties, but got an object with {len(value)} properties instead.",
            param=name,
        )
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise BadRequest(
                f"Invalid '{name}': a key is longer than {MAX_METADATA_KEY} characters ({len(key)}).",
                param=name,
            )
        if type(item) is not str:
            raise invalid_type(f"{name}.{key}", "a string", item)
        check_length(f"{name}.{key}", item, MAX_METADATA_VALUE)


def _check_safety_identifier(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not str:
        raise invalid_type(name, "a string", value)
    check_length(name, value, MAX_SAFETY_IDENTIFIER)


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(name: str, value: Any, _request: dict[str, Any]) -> None:
        if type(value) is not str:
            raise invalid_type(name, "a string", value)
        if value not in choices:
            raise invalid_value(name, value, choices)

    return check


def _check_modalities(name: str, value: Any, _request: dict[str, Any]) -> None:
    if type(value) is not list:
        raise invalid_type(name, "an array of strings", value)
    for index, item in enumerate(value):
        _one_of(("text", "audio"))(f"{name}[{index}]", item, _request)


VERBOSITIES = ("low", "medium", "high")
_TAKES_VERBOSITY = re.compile(r"gpt-5(\.[0-9]+)?(-(?!chat)[a-z0-9.-]*)?|gpt-5\.[0-9]+-chat[a-z0-9.-]*")
"""gpt-5's models (gpt-5-mini, gpt-5.1, gpt-5.1-chat-latest; not gpt-5-chat-latest): the ones
that take a ``verbosity`` other than ``medium``."""


def _check_verbosity(name: str, value: Any, request: dict[str, Any]) -> None:
    """``low``, ``medium`` or ``high``, and only ``medium`` for a model outside gpt-5's (it was
    answered 200 whatever it held, for any model)."""
    if type(value) is not str:
        raise invalid_type(name, "a string", value)
    if value not in VERBOSITIES:
        raise invalid_value(name, value, VERBOSITIES)
    model = request["model"].rpartition("/")[2].lower()
    if value != "medium" and not _TAKES_VERBOSITY.fullmatch(model):
        raise BadRequest(
            f"Unsupported value: '{name}' does not support {value!r} with this model."
            " Supported values are: 'medium'.",
            param=name,
            code="unsupported_value",
        )


CHECKS: dict[str, Any] = {
    "top_p": _number_within(0, 1),
    "frequency_penalty": _number_within(-2, 2),
    "presence_penalty": _number_within(-2, 2),
    "seed": _of_type(int, "an integer"),
    "logprobs": _of_type(bool, "a boolean"),
    "store": _of_type(bool, "a boolean"),
    "parallel_tool_calls": _of_type(bool, "a boolean"),
    "user": _of_type(str, "a string"),
    "metadata": _check_metadata,
    "safety_identifier": _check_safety_identifier,
    "prompt_cache_key": _of_type(str, "a string"),
    "prompt_cache_retention": _one_of(("in_memory", "24h")),
    "modalities": _check_modalities,
    "top_logprobs": _check_top_logprobs,
    "stop": _check_stop,
    "response_format": _check_response_format,
    "logit_bias": _check_logit_bias,
    "tools": _check_tools,
    "tool_choice": _check_tool_choice,
    "service_tier": _check_service_tier,
    "reasoning_effort": _check_reasoning_effort,
    "verbosity": _check_verbosity,
}
"""How each field OpenAI takes (and the simulator does not read) is checked, as OpenAI checks it."""
