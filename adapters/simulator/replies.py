"""What the LLM simulator answers: scripted JSON step decisions, usage counts, latencies, faults."""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from flowledger.adapters.simulator import customer_service
from flowledger.adapters.simulator.logprobs import TOKEN_CHARS, choice_logprobs, token_logprobs
from flowledger.adapters.simulator.tool_calls import ForcedCall, call_deltas, call_finish, call_message
from flowledger.domain.errors import ValidationError
from flowledger.domain.model_parameters import takes_completion_tokens_only
from flowledger.domain.prompts import CLASSIFICATION_MARKER, RANKING_MARKER, STEP_LINE

# Mean latencies from the seed's model table (ms); the simulator draws around them.
DEFAULT_MODEL_LATENCY_MS: dict[str, float] = {
    "deepseek-v3.2": 45.0,
    "gemini-2.5-flash": 60.0,
    "gpt-4.1": 120.0,
    "claude-sonnet-4.5": 150.0,
}
# Models that think: they report reasoning tokens inside completion_tokens (OpenAI's reasoning
# models too: ``takes_completion_tokens_only``).
REASONING_MODELS = frozenset({"gemini-2.5-flash"})


def thinks(model: str) -> bool:
    """Whether ``model`` reasons before it answers (reports reasoning tokens, takes ``reasoning_effort``)."""
    return model in REASONING_MODELS or takes_completion_tokens_only(model)


FAULTS = ("429", "500", "503", "timeout", "malformed", "drop")
ASKED_FAULTS = (*FAULTS, "insufficient_quota")
"""The faults ``x-sim-fault`` may ask for: those drawn by rate, and OpenAI's 429 for an
exhausted quota, which a client must not retry (asked for only: no run draws it at a rate)."""
MAX_LATENCY_MS = 600_000.0
"""The longest mean latency, configured or asked for (``x-sim-latency-ms``): ten minutes."""

# The older four-step script (greet -> classify_intent -> resolve -> satisfaction), kept for
# callers that name those steps; the seed's own flow is in ``customer_service``.
_NEXT_STEP = {"greet": "classify_intent", "classify_intent": "resolve", "resolve": "satisfaction"}
_CATEGORIES = (
    ("bug_fix", ("fix", "bug", "crash", "race", "leak", "error", "broken")),
    ("documentation", ("document", "docs", "readme", "runbook")),
    ("review", ("review", "audit")),
    ("deployment", ("deploy", "release", "rollout", "pipeline", "helm", "terraform", "kubernetes")),
    ("research", ("research", "investigate", "evaluate", "spike", "compare")),
)
_COMPLEXITY = (
    ("critical", ("outage", "production down", "security", "data loss")),
    ("high", ("migrate", "refactor", "redesign", "race", "scale")),
    ("low", ("typo", "copy", "rename", "small", "docs")),
)
_HOURS = {"low": 1.5, "medium": 4.0, "high": 12.0, "critical": 6.0}
_STEP_LINE = re.compile(re.escape(STEP_LINE) + r"([^\n]+)")


@dataclass(frozen=True, kw_only=True)
class FaultRates:
    """Probability of each injected fault per request (they are drawn in this order)."""

    rate_limited: float = 0.0
    server_error: float = 0.0
    unavailable: float = 0.0
    timeout: float = 0.0
    malformed: float = 0.0
    dropped: float = 0.0

    def __post_init__(self) -> None:
        values = [getattr(self, name) for name in self.__dataclass_fields__]
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):  # ("0.1": a TypeError)
            raise ValidationError("faults", f"rates must be numbers in [0, 1], got {values}")
        if any(not 0 <= v <= 1 for v in values) or sum(values) > 1:
            raise ValidationError("faults", f"rates must be in [0, 1] and sum to at most 1, got {values}")

    def draw(self, rng: random.Random) -> str | None:
        """A fault name from FAULTS, or None for a normal reply."""
        roll = rng.random()
        for name, rate in zip(FAULTS, self._rates(), strict=True):
            if roll < rate:
                return name
            roll -= rate
        return None

    def _rates(self) -> tuple[float, ...]:
        return (
            self.rate_limited,
            self.server_error,
            self.unavailable,
            self.timeout,
            self.malformed,
            self.dropped,
        )


CACHE_MIN_TOKENS = 1_024
"""OpenAI caches only prompts of 1,024 tokens or more (its prompt caching guide): the
simulator reported a repeated 500-token system prompt as 448 tokens cached."""

CACHE_STEP_TOKENS = 128
"""OpenAI's cache hits come in increments of 128 tokens (1,024, 1,152, 1,280, ...)."""


@dataclass(frozen=True, kw_only=True)
class SimulatorConfig:
    """How the simulator behaves; per-request headers (``x-sim-*``) override it."""

    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    latency_ms: float | None = None
    latency_sigma: float = 0.25
    model_latency_ms: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MODEL_LATENCY_MS))
    faults: FaultRates = field(default_factory=FaultRates)
    retry_after_s: float = 0.05
    hang_s: float = 600.0
    """How long the ``timeout`` fault holds a request, unanswered, before it drops the
    connection; the client's own timeout normally ends it first (this is the OpenAI SDK's
    default read timeout, and ten times flowledger's)."""
    cache_min_tokens: int = CACHE_MIN_TOKENS
    """The shortest system prompt a repeat reports as cached (OpenAI's 1,024; a test may
    lower it, but cache hits still come in whole 128-token steps)."""
    seed: int | None = None

    def __post_init__(self) -> None:
        """Refuse what would make every request hang or fail (an infinite latency, a negative
        wait, an empty key or one no header can carry, which no client can match)."""
        for name, value, most in (
            ("latency_ms", self.latency_ms, MAX_LATENCY_MS),
            ("retry_after", self.retry_after_s, 3_600.0),
            ("hang_s", self.hang_s, 3_600.0),
            ("latency_sigma", self.latency_sigma, MAX_LATENCY_SIGMA),
        ):
            if value is not None and not _number_within(value, most):
                raise ValidationError(name, f"must be a number from 0 to {most:,.0f}, got {value!r}")
        _require_serving(self)
        if self.api_key is not None and not self.api_key.strip():
            raise ValidationError("api_key", "must not be blank (leave it out to accept any key)")
        key = self.api_key
        if key is not None and not (key.isascii() and key.isprintable() and key == key.strip()):
            # A header cannot carry it as given (a line break, a space at an end, a character
            # past ASCII), so every request was refused 401: the simulator served no one.
            raise ValidationError(
                "api_key",
                "must be printable ASCII with no space at either end (a header carries it),"
                f" got {key[:40]!r}",
            )

    def mean_latency_ms(self, model: str) -> float:
        """The mean latency of ``model`` (the override, else its own, else 45 ms)."""
        if self.latency_ms is not None:
            return self.latency_ms
        return self.model_latency_ms.get(model, 45.0)


MAX_LATENCY_SIGMA = 10.0
"""The widest log-normal spread taken (0.25 by default): past it a draw is hours or nothing."""


def _number_within(value: object, most: float) -> bool:
    """Whether ``value`` is a number (not a bool) from 0 to ``most`` (NaN is not)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= most


def _require_serving(config: SimulatorConfig) -> None:
    """The rest of ``config`` as the server reads it (each was taken, and every request then
    failed, or the server would not start, with a bare error): ``latency_sigma="0.5"`` or
    ``faults=5`` broke every connection, ``host=5`` was a TypeError."""
    if not isinstance(config.host, str) or not config.host:
        raise ValidationError("host", f"must be a host name or address, got {config.host!r}")
    if type(config.port) is not int or not 0 <= config.port <= 65_535:
        raise ValidationError("port", f"must be a whole number from 0 to 65535, got {config.port!r}")
    latencies = config.model_latency_ms
    if not isinstance(latencies, dict) or not all(
        isinstance(model, str) and _number_within(mean, MAX_LATENCY_MS) for model, mean in latencies.items()
    ):
        raise ValidationError(
            "model_latency_ms", f"must map model names to mean latencies from 0 to {MAX_LATENCY_MS:,.0f} ms"
        )
    if not isinstance(config.faults, FaultRates):
        raise ValidationError("faults", f"must be a FaultRates, got {type(config.faults).__name__}")
    if type(config.cache_min_tokens) is not int or config.cache_min_tokens < 0:
        raise ValidationError(
            "cache_min_tokens", f"must be a whole number >= 0, got {config.cache_min_tokens!r}"
        )
    if config.seed is not None and type(config.seed) is not int:
        raise ValidationError("seed", f"must be a whole number or None, got {config.seed!r}")


def draw_latency_s(mean_ms: float, sigma: float, rng: random.Random) -> float:
    """A log-normal latency whose mean is ``mean_ms`` (a long right tail, like real APIs)."""
    if mean_ms <= 0:
        return 0.0
    if sigma <= 0:
        return mean_ms / 1000
    mu = math.log(mean_ms) - sigma * sigma / 2
    return rng.lognormvariate(mu, sigma) / 1000


def count_tokens(text: str) -> int:
    """About four characters a token, as the tokenizers of these models average on English."""
    return max(1, math.ceil(len(text) / 4))


LOW_DETAIL_IMAGE_TOKENS = 85
HIGH_DETAIL_IMAGE_TOKENS = 765
"""An image's prompt tokens as OpenAI bills them: 85 at ``detail: low``; otherwise by its
512-pixel tiles, 765 for a 1024x1024 image (its size is not read here)."""


def message_text(message: dict[str, Any]) -> str:
    """A message's text: its content, or the text of its content parts (not their repr)."""
    content = message.get("content")
    if type(content) is str:
        return content
    if type(content) is not list:
        return ""
    return "".join(part["text"] for part in content if type(part) is dict and type(part.get("text")) is str)


def message_tokens(message: dict[str, Any]) -> int:
    """A message's prompt tokens: its text, an image by its detail (not by the length of its
    data URL: a 400 KB one was counted as 100,000 tokens), the calls an assistant's message
    made (their names and arguments), and 4 for the message's framing.
    Parts were counted as their Python repr (``[{'type': 'text', ...}]``), more than their text."""
    content = message.get("content")
    images = 0
    if type(content) is list:
        for part in content:
            if type(part) is dict and part.get("type") == "image_url":
                image = part.get("image_url")
                low = type(image) is dict and image.get("detail") == "low"
                images += LOW_DETAIL_IMAGE_TOKENS if low else HIGH_DETAIL_IMAGE_TOKENS
    made = _calls_made(message)
    return count_tokens(message_text(message)) + images + (count_tokens(made) if made else 0) + 4


def _calls_made(message: dict[str, Any]) -> str:
    """The names and arguments of the calls an assistant's message made (``tool_calls``, or the
    legacy ``function_call``)."""
    calls = message.get("tool_calls")
    functions = [call.get("function") for call in calls if type(call) is dict] if type(calls) is list else []
    functions.append(message.get("function_call"))
    return "".join(
        f"{function.get('name', '')}{function.get('arguments', '')}"
        for function in functions
        if type(function) is dict
    )


def cut_at_stop(content: str, stops: tuple[str, ...]) -> str:
    """``content`` up to the first of the ``stops`` it holds, which is left out, as OpenAI
    ends a reply (they were ignored: the whole reply came, the sequence in it)."""
    ends = [found for stop in stops if stop and (found := content.find(stop)) >= 0]
    return content[: min(ends)] if ends else content


def reply_content(messages: list[dict[str, Any]]) -> str:
    """What the simulated model answers: text for the seed's Dify handler nodes, else JSON."""
    prompt = "\n".join(message_text(m) for m in messages)
    dify = customer_service.dify_reply(prompt)
    return dify if dify is not None else json.dumps(step_decision(messages))


def step_decision(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON decision a well-behaved model would give for the step named in the prompt."""
    system = " ".join(message_text(m) for m in messages if m.get("role") == "system")
    user = " ".join(message_text(m) for m in messages if m.get("role") == "user")
    if CLASSIFICATION_MARKER in system:
        # The seed's prompt asks for estimated_duration_hours, flowledger's for estimated_hours.
        hours_key = "estimated_duration_hours" if "estimated_duration_hours" in system else "estimated_hours"
        return task_classification(user, hours_key)
    if RANKING_MARKER in system:
        return agent_pick(user)
    found = _STEP_LINE.search(system)
    step = found.group(1).strip() if found else "reply"
    seed_flow = customer_service.step_decision(step, _context_of(user))
    if seed_flow is not None:
        return seed_flow
    intent = customer_service.intent_of(user)
    if step == "greet":
        return {
            "action": "greet",
            "context_update": {"greeted": True},
            "next_step": _NEXT_STEP[step],
            "message": "Hello! How can I help you today?",
        }
    if step == "classify_intent":
        return {
            "action": "classify",
            "context_update": {"intent": intent, "confidence": 0.92},
            "next_step": _NEXT_STEP[step],
            "message": f"I understand this is about {intent.replace('_', ' ')}.",
        }
    if step == "resolve":
        return {
            "action": "resolve",
            "context_update": {"resolved": True, "resolution": f"handled_{intent}"},
            "next_step": _NEXT_STEP[step],
            "message": "I have taken care of that for you.",
        }
    if step == "satisfaction":
        return {
            "action": "complete",
            "context_update": {"satisfaction_asked": True},
            "next_step": None,
            "message": "Was I able to help? Please rate this conversation.",
        }
    return {"action": "respond", "context_update": {}, "next_step": None, "message": "Noted."}


def _context_of(user: str) -> dict[str, Any]:
    """The merged context and input the step prompt sends as its user message (JSON)."""
    try:
        value = json.loads(user)
    except ValueError:
        return {"message": user}
    return value if isinstance(value, dict) else {"message": user}


def task_classification(task_text: str, hours_key: str = "estimated_hours") -> dict[str, Any]:
    """What a model would answer to the task-classification prompt (category, complexity and
    hours under the key the prompt asks for): keywords decide."""
    lowered = task_text.lower()
    category = next((name for name, words in _CATEGORIES if any(w in lowered for w in words)), "feature")
    complexity = next((name for name, words in _COMPLEXITY if any(w in lowered for w in words)), "medium")
    return {
        "category": category,
        "complexity": complexity,
        hours_key: _HOURS[complexity],
    }


def agent_pick(prompt: str) -> dict[str, Any]:
    """What a model would answer to the ranking prompt: the listed agent with the most skills
    named in the task's words (ties: the first id in alphabetical order)."""
    task, _, listed = prompt.partition("\nAgents:\n")
    words = set(re.findall(r"[a-z0-9+#.-]+", task.lower()))
    agents = []
    for line in listed.splitlines():
        agent_id, _, skills = line.removeprefix("- ").partition(": ")
        named = [skill for skill in skills.split(", ") if skill.lower() in words]
        agents.append((-len(named), agent_id, named))
    if not agents:
        return {"agent_id": None, "reason": "no agents were listed"}
    _, agent_id, named = min(agents)
    fit = ", ".join(named) or "no skill named in the task"
    return {"agent_id": agent_id, "reason": f"the task names {fit}"}


def completion_body(
    model: str,
    messages: list[dict[str, Any]],
    content: str,
    cached: int,
    rng: random.Random,
    *,
    max_tokens: int | None = None,
    n: int = 1,
    call: ForcedCall | None = None,
    top_logprobs: int | None = None,
    service_tier: str = "default",
    tool_tokens: int = 0,
) -> dict[str, Any]:
    """A chat.completion object with OpenAI-shaped usage (cached and reasoning details): ``n``
    identical choices, each cut to ``max_tokens`` (reasoning spends them first), and then
    ``finish_reason`` is ``length``. With ``call``, ``content`` is its arguments and each
    choice makes that tool call. With ``top_logprobs`` (not None), each choice carries the log
    probability of each token of its content, with that many alternatives. ``service_tier``:
    the tier it says served it."""
    prompt = sum(message_tokens(m) for m in messages) + 3 + tool_tokens
    reasoning = rng.randint(16, 96) if thinks(model) else 0
    shown, finish = count_tokens(content), "stop"
    if max_tokens is not None and reasoning + shown > max_tokens:
        reasoning = min(reasoning, max_tokens)
        # count_tokens is 4 characters a token, rounded up: this many characters fit.
        content = content[: (max_tokens - reasoning) * 4]
        shown, finish = count_tokens(content) if content else 0, "length"
    completion = (shown + reasoning) * n
    logprobs = None
    if top_logprobs is not None:
        tokens = token_logprobs(content, top_logprobs, rng) if call is None else None
        logprobs = choice_logprobs(tokens)
    return {
        "id": f"chatcmpl-sim-{rng.getrandbits(48):012x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                # OpenAI's schema requires refusal (null when the model did not refuse).
                "message": {"role": "assistant", "content": content, "refusal": None}
                if call is None
                else call_message(call, content, rng),
                "finish_reason": finish if call is None or finish == "length" else call_finish(call),
                "logprobs": logprobs,
            }
            for i in range(n)
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # Every detail OpenAI reports, each a count (the SDK reads one left out as None).
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt), "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning * n,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": service_tier,
    }


def stream_chunks(body: dict[str, Any], include_usage: bool, pieces: int = 4) -> list[str]:
    """The reply as SSE ``data:`` payloads, shaped as OpenAI sends them: for each choice its
    role, content pieces and finish (``logprobs`` null on each); then, with ``include_usage``,
    the usage in a chunk without choices (every other chunk carrying ``usage: null``, as
    OpenAI documents: a client reading ``chunk["usage"]`` failed on the first one); then
    ``[DONE]``."""
    base: dict[str, Any] = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
        "service_tier": body["service_tier"],
    }
    chunks: list[dict[str, Any]] = []
    for choice in body["choices"]:
        index, message, logprobs = choice["index"], choice["message"], choice["logprobs"]
        if "tool_calls" in message or "function_call" in message:
            chunks += [_chunk_choice(base, index, d, None) for d in call_deltas(message, pieces)]
        else:
            content = message["content"]
            size = max(1, math.ceil(len(content) / pieces))
            tokens = logprobs["content"] if logprobs else None
            if tokens is not None:  # whole tokens to a delta, so that each carries its own
                size = math.ceil(size / TOKEN_CHARS) * TOKEN_CHARS
            chunks.append(
                _chunk_choice(base, index, {"role": "assistant", "content": "", "refusal": None}, None)
            )
            chunks += [
                _chunk_choice(
                    base,
                    index,
                    {"content": content[i : i + size]},
                    None,
                    None
                    if tokens is None
                    else choice_logprobs(tokens[i // TOKEN_CHARS : (i + size) // TOKEN_CHARS]),
                )
                for i in range(0, len(content), size)
            ]
        chunks.append(_chunk_choice(base, index, {}, choice["finish_reason"]))
    if include_usage:
        chunks = [{**c, "usage": None} for c in chunks]
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return [json.dumps(c) for c in chunks] + ["[DONE]"]


def _chunk_choice(
    base: dict[str, Any],
    index: int,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        **base,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
