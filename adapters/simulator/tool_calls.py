"""Tool calls: a request whose ``tool_choice`` makes the model call a function (``required``,
or an object naming one) is answered with that call, as OpenAI answers it.

The simulator answered such a request with its text reply (``tool_calls`` null, finish
``stop``), so a client written for function calling (the SDK's ``pydantic_function_tool``
with ``parse()``) got no call at all. The call's arguments fit the function's ``parameters``
schema (``structured.fitted_reply``); ``auto`` and ``none`` are answered with text, as a model
that chooses not to call is. The legacy way of asking (``functions`` with ``function_call``
naming one, which the SDK still sends) is answered with the legacy message, a ``function_call``
in place of ``tool_calls``: it too was answered with text.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, NamedTuple

from flowledger.adapters.simulator.refusals import check_length
from flowledger.adapters.simulator.structured import fitted_reply
from flowledger.adapters.simulator.wire import BadRequest


class ForcedCall(NamedTuple):
    """The function a reply must call."""

    name: str
    parameters: Any
    """Its JSON schema, as the request gave it (anything: an object is read)."""
    named: bool
    """Whether ``tool_choice`` named it (OpenAI then ends the choice with ``stop``, not
    ``tool_calls``)."""
    legacy: bool = False
    """Whether ``function_call`` named it from ``functions``: the reply's message then carries
    a ``function_call``, not ``tool_calls``."""


def forced_call(request: dict[str, Any]) -> ForcedCall | None:
    """The call ``request`` forces, else None; a ``BadRequest`` for a function tool without a
    name, or a ``tool_choice`` that names no tool given (OpenAI refuses both). ``tools`` and
    ``tool_choice`` are already checked for their JSON types."""
    functions: dict[str, dict[str, Any]] = {}
    tools = request.get("tools")
    if tools == []:
        raise BadRequest(
            "Invalid 'tools': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="tools",
            code="empty_array",
        )
    if not tools and request.get("parallel_tool_calls") is not None:
        raise BadRequest(
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when"
            " 'tools' are specified.",
            param="parallel_tool_calls",
        )
    for index, tool in enumerate(tools or ()):
        if tool.get("type") != "function":  # custom tools: a text reply, as with none
            continue
        function = tool.get("function")
        if type(function) is not dict:
            raise _refusal(f"tools[{index}].function", function, "an object")
        name = function.get("name")
        if type(name) is not str:
            raise _refusal(f"tools[{index}].function.name", name, "a string")
        check_name(f"tools[{index}].function.name", name)
        functions.setdefault(name, function)
    if request.get("functions") is not None or request.get("function_call") is not None:
        legacy = _legacy_call(request)
        if request.get("tool_choice") is None:
            return legacy
    choice = request.get("tool_choice")
    if choice is None or choice == "none":
        return None
    # "auto" without tools was taken: OpenAI refuses any choice but "none" without them.
    if not request.get("tools"):
        raise BadRequest(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    if choice == "auto":
        return None
    if choice == "required":
        first = next(iter(functions.values()), None)
        return None if first is None else ForcedCall(first["name"], first.get("parameters"), named=False)
    if choice.get("type") != "function":  # allowed_tools, custom: not forced here
        return None
    named = choice.get("function")
    name = named.get("name") if type(named) is dict else None
    function = functions.get(name) if type(name) is str else None
    if function is None:
        raise BadRequest(
            f"Invalid value for 'tool_choice': no function named {str(name)[:64]!r} is in 'tools'.",
            param="tool_choice",
            code="invalid_value",
        )
    return ForcedCall(function["name"], function.get("parameters"), named=True)


_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]+")
MAX_FUNCTION_NAME = 64
"""A function's (or a response format's schema's) name as OpenAI takes it: 1 to 64 ASCII
letters, digits, underscores and dashes."""


def check_name(param: str, name: str) -> None:
    """Refuse a function's (or a ``json_schema`` response format's) name OpenAI refuses
    (``get.order``, ``get order``, 65 characters, empty): each was answered 200, and the
    client's first call at OpenAI was a 400."""
    if not name:
        raise BadRequest(
            f"Invalid '{param}': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            param=param,
            code="empty_string",
        )
    check_length(param, name, MAX_FUNCTION_NAME)
    if not _FUNCTION_NAME.fullmatch(name):
        raise BadRequest(
            f"Invalid '{param}': string does not match pattern. Expected a string that matches the"
            " pattern '^[a-zA-Z0-9_-]+$'.",
            param=param,
            code="invalid_value",
        )


def _legacy_call(request: dict[str, Any]) -> ForcedCall | None:
    """The call ``function_call`` forces from ``functions`` (an object naming one), else None
    (``auto``, ``none``, left out); a ``BadRequest`` where OpenAI refuses them."""
    functions: dict[str, dict[str, Any]] = {}
    given = request.get("functions")
    if given is not None and type(given) is not list:
        raise _refusal("functions", given, "an array")
    for index, function in enumerate(given or ()):
        if type(function) is not dict:
            raise _refusal(f"functions[{index}]", function, "an object")
        if type(function.get("name")) is not str:
            raise _refusal(f"functions[{index}].name", function.get("name"), "a string")
        check_name(f"functions[{index}].name", function["name"])
        functions.setdefault(function["name"], function)
    choice = request.get("function_call")
    if choice is None or choice in ("auto", "none"):
        return None
    if type(choice) is str:
        raise BadRequest(
            f"Invalid value: {choice[:40]!r}. Supported values are: 'auto', 'none'.",
            param="function_call",
            code="invalid_value",
        )
    if type(choice) is not dict:
        raise _refusal("function_call", choice, "a string or an object")
    if not functions:
        raise BadRequest(
            "Invalid value for 'function_call': 'function_call' is only allowed when 'functions' are"
            " specified.",
            param="function_call",
        )
    name = choice.get("name")
    function = functions.get(name) if type(name) is str else None
    if function is None:
        raise BadRequest(
            f"Invalid value for 'function_call': no function named {str(name)[:64]!r} is in 'functions'.",
            param="function_call",
            code="invalid_value",
        )
    return ForcedCall(function["name"], function.get("parameters"), named=True, legacy=True)


def call_arguments(call: ForcedCall, content: str) -> str:
    """The call's arguments as JSON text fitting its parameters (the simulated answer's values
    where they fit); ``{}`` for a function that takes none."""
    schema = call.parameters if type(call.parameters) is dict else {}
    arguments = json.loads(fitted_reply(schema, content))
    return json.dumps(arguments if type(arguments) is dict else {})


def call_message(call: ForcedCall, arguments: str, rng: random.Random) -> dict[str, Any]:
    """An assistant message making ``call`` with ``arguments``, an id of its own (none for a
    legacy ``function_call``, which OpenAI gives none)."""
    if call.legacy:
        return {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "function_call": {"name": call.name, "arguments": arguments},
        }
    return {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": f"call_{rng.getrandbits(96):024x}",
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            }
        ],
    }


def call_finish(call: ForcedCall) -> str:
    """How a choice making ``call`` ends (``stop`` when ``tool_choice`` named the function)."""
    return "stop" if call.named else "tool_calls"


def call_deltas(message: dict[str, Any], pieces: int) -> list[dict[str, Any]]:
    """A tool-call message as a stream sends it: the call's id and name with empty arguments,
    then the arguments in ``pieces``, each delta naming the call by its index (a legacy
    ``function_call`` alike, without id or index)."""
    if "function_call" in message:
        name, arguments = message["function_call"]["name"], message["function_call"]["arguments"]
        size = max(1, -(-len(arguments) // pieces))
        opening = {"name": name, "arguments": ""}
        return [{"role": "assistant", "content": None, "refusal": None, "function_call": opening}] + [
            {"function_call": {"arguments": arguments[i : i + size]}} for i in range(0, len(arguments), size)
        ]
    call = message["tool_calls"][0]
    arguments = call["function"]["arguments"]
    first = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
    size = max(1, -(-len(arguments) // pieces))
    return [{"role": "assistant", "content": None, "refusal": None, "tool_calls": [first]}] + [
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments[i : i + size]}}]}
        for i in range(0, len(arguments), size)
    ]


def _refusal(param: str, got: Any, expected: str) -> BadRequest:
    if got is None:
        return BadRequest(
            f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {type(got).__name__} instead.",
        param=param,
        code="invalid_type",
    )


def check_tool_turns(messages: list[dict[str, Any]]) -> None:
    """Raise ``BadRequest`` where ``messages`` do not pair calls and results as OpenAI requires:
    the calls an assistant's message makes are each answered by a ``tool`` message naming it,
    in the messages right after it; a ``tool`` message answers a call of the assistant's message
    before it. Both were answered 200, so an agent loop that dropped a result passed here and
    was refused by OpenAI. (Each message is already checked for its shape: a ``tool`` message
    has its ``tool_call_id``.)"""
    asked: set[str] = set()
    waiting: dict[str, None] = {}  # the calls not yet answered, in their order
    caller = -1  # the index of the assistant's message that made them
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            if caller < 0:
                raise BadRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding"
                    " message with 'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            if call_id not in asked:
                raise BadRequest(
                    f"Invalid parameter: 'tool_call_id' of '{call_id[:64]}' not found in 'tool_calls' of"
                    " previous message.",
                    param=f"messages.[{index}].tool_call_id",
                )
            waiting.pop(call_id, None)
            continue
        _check_answered(waiting, caller)
        asked, caller = set(), -1
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            waiting = dict.fromkeys(_call_ids(calls, index))
            asked, caller = set(waiting), index
    _check_answered(waiting, caller)


def _call_ids(calls: Any, index: int) -> list[str]:
    if type(calls) is not list:
        raise _refusal(f"messages[{index}].tool_calls", calls, "an array")
    ids = []
    for number, call in enumerate(calls):
        call_id = call.get("id") if type(call) is dict else None
        if type(call_id) is not str:
            raise _refusal(f"messages[{index}].tool_calls[{number}].id", call_id, "a string")
        ids.append(call_id)
    return ids


def _check_answered(waiting: dict[str, None], caller: int) -> None:
    if waiting:
        raise BadRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to"
            " each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(call_id[:64] for call_id in list(waiting)[:10]),
            param=f"messages.[{caller}].role",
        )
