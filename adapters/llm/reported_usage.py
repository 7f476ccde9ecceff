"""Reading a reply's usage object in OpenAI's, Anthropic's or Gemini's shape into one set of counts.

Counts follow the OpenTelemetry GenAI fields (``input_tokens`` include cache reads, cache
writes and audio, ``output_tokens`` include reasoning and audio). The shapes:

- OpenAI chat completions (and the proxies that speak it: LiteLLM, OpenRouter): ``prompt_tokens``
  (cache included), ``prompt_tokens_details.cached_tokens``,
  ``completion_tokens_details.reasoning_tokens`` (within ``completion_tokens``, or beside it when
  ``total_tokens`` says so, as proxies of Gemini's thinking models send it; a total past prompt
  and completion with no reasoning count is reasoning left out, as other such proxies send it);
  cache writes as ``cache_creation_input_tokens`` (LiteLLM, with ``cache_creation_token_details``) or
  ``prompt_tokens_details.cache_write_tokens`` (OpenRouter); OpenRouter's own charge as ``cost``
  (USD); DeepSeek's cache hits as ``prompt_cache_hit_tokens`` when ``cached_tokens`` is not
  given; audio as
  ``prompt_tokens_details.audio_tokens`` (less ``cached_tokens_details.audio_tokens``, the cached
  part) and ``completion_tokens_details.audio_tokens``.
- OpenAI responses: ``input_tokens`` (cache included) with ``input_tokens_details``; reasoning
  as in chat completions (``output_tokens_details.reasoning_tokens``, beside ``output_tokens``
  when ``total_tokens`` says so).
- Anthropic messages: ``input_tokens`` *excluding* ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``, the writes split by lifetime in
  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``.
- Gemini ``usageMetadata``: ``promptTokenCount`` (cached content included, plus
  ``toolUsePromptTokenCount``), ``candidatesTokenCount`` plus ``thoughtsTokenCount``,
  ``cachedContentTokenCount``; audio as the ``modality: "AUDIO"`` entries of
  ``promptTokensDetails`` (less those of ``cacheTokensDetails``) and ``candidatesTokensDetails``;
  the SDK's snake_case names too.

A count is a whole number from 0 to ``MAX_TOKENS`` (10^12, what the ledger stores), sent as an
integer, an integer-valued float (``1000.0``) or a string of ASCII digits (``"1000"``); one
left out or null is 0, except the two every reply of its shape carries (OpenAI chat's
``prompt_tokens`` and ``completion_tokens``, the Responses API's and Anthropic's ``input_tokens``
and ``output_tokens``), which cannot be read then. Any other (negative, past 10^12,
fractional, not finite, a boolean, other text) cannot be read: it is named in ``unreadable``
and counted 0, and the attempt's cost is not known (``usage.attempt_cost``), never a silent $0.
Impossible sub-counts are clamped, not trusted: a reply never makes the usage invalid.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from flowledger.domain.values import MAX_COST_USD, MAX_TOKENS


@dataclass(frozen=True, kw_only=True)
class ReportedUsage:
    """One attempt's token counts as the provider reported them, and its charge if it gave one;
    ``unreadable`` names the counts it sent that could not be read (each counted 0)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    audio_input_tokens: int = 0
    audio_output_tokens: int = 0
    provider_cost_usd: Decimal | None = None
    reported: bool = False
    unreadable: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """The token counts, as keyword arguments of ``LlmUsage`` and ``ModelPrice.cost``."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "reasoning_output_tokens": self.reasoning_output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_creation_1h_input_tokens": self.cache_creation_1h_input_tokens,
            "audio_input_tokens": self.audio_input_tokens,
            "audio_output_tokens": self.audio_output_tokens,
        }


def parse_usage(usage: Any) -> ReportedUsage:
    """The counts in ``usage`` (any of the shapes in the module docstring); nothing is 'not reported'."""
    if not isinstance(usage, dict) or not usage:
        return ReportedUsage()
    if "promptTokenCount" in usage or "prompt_token_count" in usage:
        return _gemini(usage)
    if "prompt_tokens" in usage:
        return _openai_chat(usage)
    if "input_tokens" in usage and "input_tokens_details" in usage:
        return _openai_responses(usage)
    if "input_tokens" in usage:
        return _anthropic(usage)
    return ReportedUsage()


def _openai_chat(usage: dict[str, Any]) -> ReportedUsage:
    read = _Counts()
    prompt_details = _object(usage.get("prompt_tokens_details"))
    completion_details = _object(usage.get("completion_tokens_details"))
    writes = (
        read(usage, "cache_creation_input_tokens")
        or read(prompt_details, "cache_write_tokens")
        or read(prompt_details, "cache_creation_tokens")
    )
    lifetimes = _object(
        usage.get("cache_creation_token_details")
        or prompt_details.get("cache_creation_token_details")
        or usage.get("cache_creation")
    )
    prompt = read.required(usage, "prompt_tokens")
    completion = read.required(usage, "completion_tokens")
    left_out, reasoning = _reasoning_left_out(
        usage, prompt, completion, read(completion_details, "reasoning_tokens"), read
    )
    return _clamped(
        read,
        input_tokens=prompt,
        output_tokens=completion + left_out,
        # DeepSeek's own API names its cache hits only as prompt_cache_hit_tokens.
        cached=read(prompt_details, "cached_tokens") or read(usage, "prompt_cache_hit_tokens"),
        reasoning=reasoning,
        writes=writes,
        writes_1h=read(lifetimes, "ephemeral_1h_input_tokens"),
        audio_in=max(
            read(prompt_details, "audio_tokens")
            - read(_object(prompt_details.get("cached_tokens_details")), "audio_tokens"),
            0,
        ),
        audio_out=read(completion_details, "audio_tokens"),
        cost=_money(usage.get("cost")),
    )


def _reasoning_left_out(
    usage: dict[str, Any], prompt: int, completion: int, reasoning: int, read: _Counts
) -> tuple[int, int]:
    """The reasoning tokens ``completion_tokens`` (the Responses API's ``output_tokens``) leaves
    out, by the reply's own total, and the reasoning tokens of the output: OpenAI counts them in
    it (``total_tokens`` is prompt plus completion), proxies of Gemini's thinking models beside
    it (the total is prompt plus completion plus reasoning). Clamped to ``completion_tokens``,
    such reasoning was billed as no output at all. A proxy that gives no reasoning count but a
    total past prompt plus completion (any-llm sent Gemini's 405 thoughts so: prompt 20,
    completion 198, total 623) left them out: billed at the output rate by Google, they cost
    nothing here; the tokens past the two are that reasoning (not when a count ``read`` could
    not read stands as 0: the call's cost is not known then anyway)."""
    total = _Counts()(usage, "total_tokens")  # read to compare only: an odd total prices nothing
    if reasoning:
        return (reasoning if total == prompt + completion + reasoning else 0), reasoning
    beyond = total - prompt - completion
    return (beyond, beyond) if beyond > 0 and not read.unreadable else (0, 0)


def _openai_responses(usage: dict[str, Any]) -> ReportedUsage:
    read = _Counts()
    given = read.required(usage, "input_tokens")
    output = read.required(usage, "output_tokens")
    left_out, reasoning = _reasoning_left_out(
        usage, given, output, read(_object(usage.get("output_tokens_details")), "reasoning_tokens"), read
    )
    return _clamped(
        read,
        input_tokens=given,
        output_tokens=output + left_out,
        cached=read(_object(usage.get("input_tokens_details")), "cached_tokens"),
        reasoning=reasoning,
    )


def _anthropic(usage: dict[str, Any]) -> ReportedUsage:
    read = _Counts()
    lifetimes = _object(usage.get("cache_creation"))
    written_5m = read(lifetimes, "ephemeral_5m_input_tokens")
    written_1h = read(lifetimes, "ephemeral_1h_input_tokens")
    writes = max(read(usage, "cache_creation_input_tokens"), written_5m + written_1h)
    cached = read(usage, "cache_read_input_tokens")
    return _clamped(
        read,
        input_tokens=read.required(usage, "input_tokens") + cached + writes,
        output_tokens=read.required(usage, "output_tokens"),
        cached=cached,
        writes=writes,
        writes_1h=written_1h,
    )


def _gemini(usage: dict[str, Any]) -> ReportedUsage:
    read = _Counts()

    def field(camel: str, snake: str) -> int:
        return read(usage, camel if camel in usage else snake)

    def audio(camel: str, snake: str) -> int:
        """The tokens of the ``AUDIO`` entries of one per-modality list."""
        entries = usage.get(camel if camel in usage else snake)
        if not isinstance(entries, list):
            return 0
        return sum(
            read(entry, "tokenCount" if "tokenCount" in entry else "token_count")
            for entry in entries
            if isinstance(entry, dict) and str(entry.get("modality", "")).upper() == "AUDIO"
        )

    thoughts = field("thoughtsTokenCount", "thoughts_token_count")
    prompt_audio = audio("promptTokensDetails", "prompt_tokens_details")
    cached_audio = audio("cacheTokensDetails", "cache_tokens_details")
    return _clamped(
        read,
        input_tokens=field("promptTokenCount", "prompt_token_count")
        + field("toolUsePromptTokenCount", "tool_use_prompt_token_count"),
        output_tokens=field("candidatesTokenCount", "candidates_token_count") + thoughts,
        cached=field("cachedContentTokenCount", "cached_content_token_count"),
        reasoning=thoughts,
        audio_in=max(prompt_audio - cached_audio, 0),
        audio_out=audio("candidatesTokensDetails", "candidates_tokens_details"),
    )


class _Counts:
    """Reads the counts of one usage object (the module docstring says which read), and names
    those that cannot be read."""

    def __init__(self) -> None:
        self.unreadable: list[str] = []

    def __call__(self, source: dict[str, Any], key: str) -> int:
        value = source.get(key)
        if value is None:
            return 0
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
            return value
        if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_TOKENS:  # nor nan, inf
            return int(value)
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 13:
            count = int(value)
            if count <= MAX_TOKENS:
                return count
        self.unreadable.append(key)
        return 0

    def required(self, source: dict[str, Any], key: str) -> int:
        """A count every usage of its shape carries: left out or null, it is not known either
        (named, counted 0). Read as 0 output tokens, a reply whose proxy dropped
        ``completion_tokens`` was priced at its prompt alone, past any enforced budget."""
        if source.get(key) is None:
            self.unreadable.append(key)
            return 0
        return self(source, key)


def _clamped(
    read: _Counts,
    *,
    input_tokens: int,
    output_tokens: int,
    cached: int = 0,
    reasoning: int = 0,
    writes: int = 0,
    writes_1h: int = 0,
    audio_in: int = 0,
    audio_out: int = 0,
    cost: Decimal | None = None,
) -> ReportedUsage:
    cached = min(cached, input_tokens)
    writes = min(writes, input_tokens - cached)
    reasoning = min(reasoning, output_tokens)
    return ReportedUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_input_tokens=cached,
        reasoning_output_tokens=reasoning,
        cache_creation_input_tokens=writes,
        cache_creation_1h_input_tokens=min(writes_1h, writes),
        audio_input_tokens=min(audio_in, input_tokens - cached - writes),
        audio_output_tokens=min(audio_out, output_tokens - reasoning),
        provider_cost_usd=cost,
        reported=True,
        unreadable=tuple(read.unreadable),
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _money(value: Any) -> Decimal | None:
    """A provider's charge: a finite number from 0 to what the ledger stores of one call
    ($10^9, at most 40 decimal places), read from its text, so 0.1 stays 0.1; None for
    another, and the table prices the call (a proxy's 1e300 was taken, and the step failed as a
    reply that cannot be recorded, its cost recorded as $10^9)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    if not amount.is_finite() or not 0 <= amount <= MAX_COST_USD:
        return None
    exponent = amount.as_tuple().exponent
    return amount if isinstance(exponent, int) and exponent >= -40 else None
