"""What a chat-completions request asks the simulator, checked as OpenAI checks it.

Every field the simulator reads is checked for its JSON type before use, so a malformed
request is a 400 ``BadRequest`` that names the field (``param``), as OpenAI answers it. The
common path is one ``type()`` test a field and one combined test a message (about 1 µs a
request beside ``json.loads``' 4 to 5); the exact complaint is worked out only on refusal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from typing import Any, NamedTuple

from flowledger.adapters.simulator.field_checks import CHECKS, NUMBER_TYPES, SERVED_TIERS
from flowledger.adapters.simulator.refusals import (
    check_length,
    count_refusal,
    invalid_type,
    invalid_value,
    kind,
    missing,
)
from flowledger.adapters.simulator.replies import ASKED_FAULTS, MAX_LATENCY_MS, count_tokens
from flowledger.adapters.simulator.tool_calls import ForcedCall, check_tool_turns, forced_call
from flowledger.adapters.simulator.wire import BadRequest
from flowledger.domain.model_parameters import takes_completion_tokens_only

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_CHOICES = 128
"""The most choices (``n``) a request may ask for, as OpenAI allows."""
MAX_COMPLETION_TOKENS = 128_000
"""The most ``max_tokens`` (or ``max_completion_tokens``) a request may ask for: the largest
completion an OpenAI chat model takes (gpt-5's), which refuses more with a 400. The simulator
took any count (``10**12``, ``10**40``) and answered 200."""
MAX_MODEL_LENGTH = 256
"""The longest model name a request may give, as OpenAI bounds a model's id."""
_NOT_IN_MODEL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
"""Control characters (NUL among them) and lone surrogates: no model is named with them, and
the name is echoed in the reply (``"model": "a\\u0000b"``) and kept in the simulator's stats."""
_READ = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "n",
    }
)
"""The fields ``chat_request`` reads (and checks on its way)."""
KNOWN_FIELDS = _READ | frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "metadata",
        "modalities",
        "moderation",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""Every request field OpenAI's chat completions take (the official SDK's
``CompletionCreateParams``, 2.x); another is refused as OpenAI refuses it."""
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
"""The kinds of a message's content part OpenAI takes (a ``text`` one carries its ``text``)."""


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
    schema: dict[str, Any] | None
    """The JSON schema of ``response_format: json_schema``, which the reply must fit."""
    call: ForcedCall | None = None
    """The function ``tool_choice`` (or the legacy ``function_call``) makes the reply call
    (``tool_calls.forced_call``)."""
    top_logprobs: int | None = None
    """With ``logprobs: true``, the alternatives asked for each token (``top_logprobs``, else
    0); None when no log probabilities are asked for."""
    stops: tuple[str, ...] = ()
    """The ``stop`` sequences: the reply ends before the first it holds."""
    service_tier: str = "default"
    """The tier the reply says served it (``SERVED_TIERS``)."""
    tool_tokens: int = 0
    """The prompt tokens of the function definitions offered (``tools``, ``functions``), which
    OpenAI bills with the prompt."""
    offered: tuple[dict[str, Any], ...] = ()
    """Those function definitions, as given: the start of the prompt's cached prefix."""


def chat_request(raw: bytes) -> ChatRequest:
    """The request in ``raw`` (a JSON body), or a ``BadRequest`` naming what is wrong."""
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        raise BadRequest("We could not parse the JSON body of your request.") from None
    if type(request) is not dict:
        raise BadRequest(f"The request body must be a JSON object, got {kind(request)}.")
    model = request.get("model")
    if type(model) is not str:
        raise invalid_type("model", "a string", model)
    if not model.strip():  # answered 200 as a model named "": OpenAI names no model so
        raise _blank_model(model)
    if len(model) > MAX_MODEL_LENGTH or not (model.isascii() and model.isprintable()):
        _check_model_name(model)
    messages = request.get("messages")
    if type(messages) is not list:
        raise invalid_type("messages", "an array of objects", messages)
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
            # Only an assistant's message carrying tool calls, or a function's result, may leave
            # its content out.
            and (
                type(content := message.get("content")) is str
                or (type(content) is list and content and all(_part_read(part) for part in content))
                or (content is None and _may_have_no_content(role, message))
            )
            # A tool's message answers a call: it names it; a function's names the function.
            and (role != "tool" or type(message.get("tool_call_id")) is str)
            and type(message.get("name", "")) is str
            and (role != "function" or "name" in message)
        ):
            raise _message_refusal(index, message)
    if any(message["role"] == "tool" or message.get("tool_calls") for message in messages):
        check_tool_turns(messages)
    stream = request.get("stream")
    if stream is not None and type(stream) is not bool:  # "false" is a non-empty string: truthy
        raise invalid_type("stream", "a boolean", stream)
    options = request.get("stream_options")
    if options is not None and type(options) is not dict:
        raise invalid_type("stream_options", "an object", options)
    include_usage = options.get("include_usage") if options else None
    if include_usage is not None and type(include_usage) is not bool:
        raise invalid_type("stream_options.include_usage", "a boolean", include_usage)
    if options is not None and not stream:  # answered 200: such a client failed at OpenAI
        raise BadRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )
    cap = request.get("max_tokens")
    if cap is not None:
        if not (type(cap) is int and 1 <= cap <= MAX_COMPLETION_TOKENS):
            raise count_refusal("max_tokens", cap, MAX_COMPLETION_TOKENS)
        _check_model_writes("max_tokens", cap, model)
    newer = request.get("max_completion_tokens")
    if newer is not None:
        if not (type(newer) is int and 1 <= newer <= MAX_COMPLETION_TOKENS):
            raise count_refusal("max_completion_tokens", newer, MAX_COMPLETION_TOKENS)
        _check_model_writes("max_completion_tokens", newer, model)
        cap = newer if cap is None else min(cap, newer)
    temperature = request.get("temperature")
    if temperature is not None and not (type(temperature) in NUMBER_TYPES and 0 <= temperature <= 2):
        raise _temperature_refusal(temperature)
    if takes_completion_tokens_only(model):
        _check_reasoning_model(request, temperature)
    n = request.get("n")
    if n is None:
        n = 1
    elif not (type(n) is int and 1 <= n <= MAX_CHOICES):
        raise count_refusal("n", n, MAX_CHOICES)
    call = top_logprobs = None
    stops: tuple[str, ...] = ()
    tier = "default"
    tool_tokens = 0
    offered: tuple[dict[str, Any], ...] = ()
    if not _READ.issuperset(request):  # the other fields OpenAI takes, checked as it checks them
        _check_other_fields(request)
        call = forced_call(request)
        if request.get("logprobs") is True:
            top_logprobs = request.get("top_logprobs") or 0
        stop = request.get("stop")
        stops = (stop,) if type(stop) is str else tuple(stop or ())
        tier = SERVED_TIERS[request.get("service_tier") or "default"]
        offered = _offered(request)
        tool_tokens = _definition_tokens(offered)
        if _json_mode(request) and not _says_json(messages):
            # Answered 200: a client asking for JSON mode without saying so passed here and
            # was refused every call by OpenAI.
            raise BadRequest(
                "'messages' must contain the word 'json' in some form, to use 'response_format' of type"
                " 'json_object'.",
                param="messages",
            )
    return ChatRequest(
        model,
        messages,
        stream is True,
        include_usage is True,
        cap,
        n,
        _schema_of(request),
        call,
        top_logprobs,
        stops,
        tier,
        tool_tokens,
        offered,
    )


def _offered(request: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The function definitions ``request`` offers (``tools``' functions, then ``functions``)."""
    tools = [tool.get("function") for tool in request.get("tools") or () if tool.get("type") == "function"]
    return (*tools, *(request.get("functions") or ()))


def _definition_tokens(offered: tuple[dict[str, Any], ...]) -> int:
    """The prompt tokens of the functions offered (their JSON, four characters a token)."""
    if not offered:
        return 0
    try:
        return count_tokens(json.dumps(offered))
    except RecursionError:  # nested as deep as the parser took: counted by the functions alone
        return len(offered)


_MODEL_WRITES = (
    (re.compile(r"gpt-4\.1(-mini|-nano)?(-[0-9]{4}-[0-9]{2}-[0-9]{2})?"), 32_768),
    (re.compile(r"(chatgpt-)?gpt-4o(-mini)?(-[0-9]{4}-[0-9]{2}-[0-9]{2}|-latest)?"), 16_384),
)
"""The most completion tokens OpenAI's chat models of a smaller output than
``MAX_COMPLETION_TOKENS`` write (gpt-4.1's 32,768, gpt-4o's 16,384), by name (dated too)."""


def _check_model_writes(field: str, cap: int, model: str) -> None:
    """Refuse a token cap past what ``model`` writes, as OpenAI does: gpt-4.1 took any cap up
    to 128,000, and a client configured for 40,000 passed here and failed every call."""
    name = model.rpartition("/")[2].lower()
    most = next((most for pattern, most in _MODEL_WRITES if pattern.fullmatch(name)), MAX_COMPLETION_TOKENS)
    if cap > most:
        raise BadRequest(
            f"{field} is too large: {cap}. This model supports at most {most} completion tokens,"
            f" whereas you provided {cap}.",
            param=field,
            code="invalid_value",
        )


def _schema_of(request: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a ``json_schema`` response format names (checked by then), else None."""
    given = request.get("response_format")
    if type(given) is not dict or given.get("type") != "json_schema":
        return None
    schema = given["json_schema"].get("schema")
    return schema if type(schema) is dict else None


def _json_mode(request: dict[str, Any]) -> bool:
    """Whether ``request`` asks for JSON mode (``response_format`` of type ``json_object``)."""
    given = request.get("response_format")
    return type(given) is dict and given.get("type") == "json_object"


def _says_json(messages: list[dict[str, Any]]) -> bool:
    """Whether any message's text holds the word "json", in any case, as OpenAI requires of
    JSON mode."""
    for message in messages:
        content: Any = message.get("content")
        texts = [content] if type(content) is str else content if type(content) is list else []
        for part in texts:
            text = part.get("text") if type(part) is dict else part
            if type(text) is str and "json" in text.lower():
                return True
    return False


def _part_read(part: Any) -> bool:
    """Whether a content part is one OpenAI reads: an object of a known type, a text one with its text."""
    return (
        type(part) is dict
        and (kind := part.get("type")) in PART_TYPES
        and (kind != "text" or type(part.get("text")) is str)
    )


def _calls_tools(message: dict[str, Any]) -> bool:
    """Whether an assistant's message stands without content: it carries tool (or function) calls."""
    return bool(message.get("tool_calls")) or bool(message.get("function_call")) or bool(message.get("audio"))


def _blank_model(model: str) -> BadRequest:
    if not model:
        return BadRequest(
            "Invalid 'model': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            param="model",
            code="empty_string",
        )
    return BadRequest(
        f"Invalid 'model': {model[:40]!r} is blank: it names no model.", param="model", code="invalid_value"
    )


def plays_model(model: str) -> bool:
    """Whether a chat request may name ``model`` (any name but a blank one, one longer than
    ``MAX_MODEL_LENGTH`` or one holding a control character): what ``GET /v1/models/{id}``
    answers, as the chat answers it."""
    return bool(model.strip()) and len(model) <= MAX_MODEL_LENGTH and _NOT_IN_MODEL.search(model) is None


def _check_model_name(model: str) -> None:
    """Raise ``BadRequest`` for a model name too long or holding a control character (a NUL
    was answered 200 and echoed back); any other name is played."""
    check_length("model", model, MAX_MODEL_LENGTH)
    found = _NOT_IN_MODEL.search(model)
    if found is not None:
        raise BadRequest(
            f"Invalid 'model': {model[:40]!r} holds a control character (U+{ord(found.group()):04X}):"
            " it names no model.",
            param="model",
            code="invalid_value",
        )


def _check_other_fields(request: dict[str, Any]) -> None:
    """Raise ``BadRequest`` for a field OpenAI does not take, or one it takes given a value it
    refuses (null is the field left out, as OpenAI reads it)."""
    for name, value in request.items():
        if name in _READ:
            continue
        if name not in KNOWN_FIELDS:
            raise BadRequest(f"Unrecognized request argument supplied: {name[:100]}")
        if value is None:
            continue
        check = CHECKS.get(name)
        if check is not None:
            check(name, value, request)


_SAMPLING_FIELDS = ("top_p", "presence_penalty", "frequency_penalty", "logit_bias")
"""Fields OpenAI's reasoning models refuse whatever they hold (as ``logprobs: true``)."""


def _check_reasoning_model(request: dict[str, Any], temperature: Any) -> None:
    """Refuse what OpenAI's reasoning models refuse: ``max_tokens``, a temperature but 1, and
    the sampling fields (``top_p``, the penalties, ``logit_bias``, ``logprobs: true``). Each
    was answered 200, so a client that sent them passed here and failed every call."""
    if request.get("max_tokens") is not None:
        raise BadRequest(
            "Unsupported parameter: 'max_tokens' is not supported with this model."
            " Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    if temperature is not None and temperature != 1:
        raise BadRequest(
            f"Unsupported value: 'temperature' does not support {temperature} with this model."
            " Only the default (1) value is supported.",
            param="temperature",
            code="unsupported_value",
        )
    refused = [name for name in _SAMPLING_FIELDS if request.get(name) is not None]
    if request.get("logprobs") is True:
        refused.insert(0, "logprobs")
    if refused:
        raise BadRequest(
            f"Unsupported parameter: '{refused[0]}' is not supported with this model.",
            param=refused[0],
            code="unsupported_parameter",
        )


def _temperature_refusal(value: Any) -> BadRequest:
    """Why ``value`` is not a temperature OpenAI takes (a number from 0 to 2)."""
    if type(value) not in NUMBER_TYPES:  # nor bool
        return invalid_type("temperature", "a decimal", value)
    if not value <= 2:  # NaN too (json.loads reads it)
        side, expected, code = "above maximum", "<= 2", "decimal_above_max_value"
    else:
        side, expected, code = "below minimum", ">= 0", "decimal_below_min_value"
    return BadRequest(
        f"Invalid 'temperature': decimal {side} value. Expected a value {expected}, but got {value} instead.",
        param="temperature",
        code=code,
    )


def _may_have_no_content(role: Any, message: dict[str, Any]) -> bool:
    """An assistant's message carrying calls, or a function's result (the SDK's
    ``ChatCompletionFunctionMessageParam`` takes null content; it was refused here)."""
    return role == "function" or (role == "assistant" and _calls_tools(message))


def _message_refusal(index: int, message: Any) -> BadRequest:
    where = f"messages[{index}]"
    if type(message) is not dict:
        return invalid_type(where, "an object", message)
    role = message.get("role")
    refused = _choice_refusal(f"{where}.role", role, ROLES)
    if refused is not None:
        return refused
    content = message.get("content")
    if content is None and not _may_have_no_content(role, message):
        return missing(f"{where}.content")
    if role == "function" and message.get("name") is None:
        return missing(f"{where}.name")
    if type(content) is list:
        if not content:
            return BadRequest(
                f"Invalid '{where}.content': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                param=f"{where}.content",
                code="empty_array",
            )
        for part_index, part in enumerate(content):
            if not _part_read(part):
                return _part_refusal(f"{where}.content[{part_index}]", part)
    elif type(content) is not str and content is not None:
        return invalid_type(f"{where}.content", "a string or an array of objects", content)
    if role == "tool" and type(message.get("tool_call_id")) is not str:
        if message.get("tool_call_id") is None:
            return BadRequest(
                "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
                param=f"{where}.tool_call_id",
                code="missing_required_parameter",
            )
        return invalid_type(f"{where}.tool_call_id", "a string", message.get("tool_call_id"))
    return invalid_type(f"{where}.name", "a string", message.get("name"))


def _choice_refusal(param: str, value: Any, choices: Collection[str]) -> BadRequest | None:
    """Why ``value`` is not one of ``choices`` (missing, not a string, another), else None."""
    if value is None:
        return missing(param)
    if type(value) is not str:
        return invalid_type(param, "a string", value)
    if value not in choices:
        return invalid_value(param, value, tuple(sorted(choices)))
    return None


def _part_refusal(where: str, part: Any) -> BadRequest:
    if type(part) is not dict:
        return invalid_type(where, "an object", part)
    refused = _choice_refusal(f"{where}.type", part.get("type"), PART_TYPES)
    if refused is not None:
        return refused
    if part.get("text") is None:
        return missing(f"{where}.text")
    return invalid_type(f"{where}.text", "a string", part.get("text"))


_MILLISECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


def latency_override_ms(headers: dict[str, str]) -> float | None:
    """``x-sim-latency-ms``: a mean latency from 0 to ``MAX_LATENCY_MS``, or None when absent
    (beyond it a 400: a request asking for more would hang, not simulate anything)."""
    given = headers.get("x-sim-latency-ms")
    if not given:
        return None
    # float() would also take "1_0", "+5" and other scripts' digits.
    value = float(given) if _MILLISECONDS.fullmatch(given) else math.nan
    if not 0 <= value <= MAX_LATENCY_MS:  # NaN fails both
        raise BadRequest(
            f"x-sim-latency-ms must be a number of milliseconds from 0 to {MAX_LATENCY_MS:,.0f}, "
            f"got {given[:40]!r}",
            param="x-sim-latency-ms",
            code="invalid_value",
        )
    return value


def fault_override(headers: dict[str, str]) -> str | None:
    """``x-sim-fault``: one of ``ASKED_FAULTS``, or None when absent."""
    given = headers.get("x-sim-fault")
    if not given:
        return None
    if given not in ASKED_FAULTS:
        raise BadRequest(
            f"x-sim-fault must be one of {', '.join(ASKED_FAULTS)}, got {given[:40]!r}",
            param="x-sim-fault",
            code="invalid_value",
        )
    return given
