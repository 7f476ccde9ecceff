"""Value objects shared by the aggregates: LLM usage, the key filter; and the input checks.

The checks themselves (``require_name``, ``require_json``, ``require_ttl`` ...) live in
``flowledger.domain.bounds`` and are importable from here too.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from hashlib import blake2b
from typing import Any

from flowledger.domain.bounds import (
    MAX_DEADLINE,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MAX_REASON_LENGTH,
    MAX_SKILLS,
    MAX_TEXT_LENGTH,
    MAX_TTL,
    duration_of,
    plain_json,
    plainly_text,
    require_count,
    require_deadline,
    require_duration,
    require_id,
    require_json,
    require_moment,
    require_name,
    require_no_controls,
    require_object,
    require_resolution,
    require_text,
    require_ttl,
    require_version,
    shown,
    storable,
)
from flowledger.domain.errors import ValidationError
from flowledger.domain.price_rule import EXACT, MAX_COST_DECIMALS, TOKEN_FIELDS, exact_sum
from flowledger.domain.price_rule import MAX_COST_USD as MAX_COST_USD  # one call's cost, re-exported

JsonObject = dict[str, Any]

__all__ = [
    "MAX_DEADLINE",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_REASON_LENGTH",
    "MAX_SKILLS",
    "MAX_TEXT_LENGTH",
    "MAX_TTL",
    "USAGE_TEXT_LIMITS",
    "JsonObject",
    "KeyFilter",
    "LlmUsage",
    "duration_of",
    "key_filter_may_hold",
    "key_filter_with",
    "plain_json",
    "require_count",
    "require_deadline",
    "require_duration",
    "require_given_usage",
    "require_id",
    "require_json",
    "require_moment",
    "require_name",
    "require_object",
    "require_resolution",
    "require_text",
    "require_ttl",
    "require_usage",
    "require_version",
    "storable",
]


@dataclass(frozen=True, kw_only=True)
class LlmUsage:
    """What one model call used and cost, named after the OpenTelemetry GenAI fields.

    ``input_tokens`` includes cache reads and cache writes; ``cost_usd`` is exact (Decimal)
    and is what the reply's tokens cost. The fields after ``extra`` were added later (each
    with a default, so older events load unchanged): ``cache_creation_input_tokens`` (cache
    writes, of which ``cache_creation_1h_input_tokens`` with a one-hour lifetime);
    ``unpriced`` (no price was known, so ``cost_usd`` is not the cost); ``cost_source``
    (``"provider"`` when the provider's own charge was taken); ``retried_cost_usd`` (what the
    attempts that did not give the answer were billed; each attempt is in
    ``extra["attempt_log"]``); ``billed_unreported`` (an attempt, the answer's included, was
    billed for tokens the provider never reported: an answer without usage, a reply or stream
    lost before its usage came. The token counts do not hold them, so no price table can
    price the call: it is ``unpriced``, and a repricing leaves it so). ``attempts`` counts the
    requests made: 0 for a call refused before any (the endpoint's breaker open);
    ``audio_input_tokens`` (the uncached audio part of ``input_tokens``) and
    ``audio_output_tokens`` (the audio part of ``output_tokens``, apart from the reasoning);
    ``retried_tokens`` (the token counts the attempts before the answer were billed for, by
    field name, zeros left out: the tokens ``retried_cost_usd`` paid for; ``billed_tokens``
    adds them to the answer's).
    """

    provider: str = "unknown"
    request_model: str = ""
    response_model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    finish_reasons: tuple[str, ...] = ()
    response_id: str = ""
    cost_usd: Decimal = Decimal("0")
    price_version: str = ""
    latency_ms: float = 0.0
    attempts: int = 1
    extra: JsonObject = field(default_factory=dict)
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    unpriced: bool = False
    cost_source: str = ""
    retried_cost_usd: Decimal = Decimal("0")
    billed_unreported: bool = False
    audio_input_tokens: int = 0
    audio_output_tokens: int = 0
    retried_tokens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (
            "provider",
            "request_model",
            "response_model",
            "response_id",
            "price_version",
            "cost_source",
        ):
            if not isinstance(getattr(self, name), str):
                raise ValidationError(f"usage.{name}", f"must be a string, got {shown(getattr(self, name))}")
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "reasoning_output_tokens",
            "attempts",
            "cache_creation_input_tokens",
            "cache_creation_1h_input_tokens",
            "audio_input_tokens",
            "audio_output_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValidationError(f"usage.{name}", f"must be an int >= 0, got {shown(value)}")
        if self.cache_read_input_tokens > self.input_tokens:
            raise ValidationError(
                "usage.cache_read_input_tokens", "cannot exceed input_tokens (which include them)"
            )
        if self.cache_read_input_tokens + self.cache_creation_input_tokens > self.input_tokens:
            raise ValidationError(
                "usage.cache_creation_input_tokens",
                "cache reads plus cache writes cannot exceed input_tokens (which include them)",
            )
        if self.cache_creation_1h_input_tokens > self.cache_creation_input_tokens:
            raise ValidationError(
                "usage.cache_creation_1h_input_tokens", "cannot exceed cache_creation_input_tokens"
            )
        if self.cache_read_input_tokens + self.cache_creation_input_tokens + self.audio_input_tokens > (
            self.input_tokens
        ):
            raise ValidationError(
                "usage.audio_input_tokens",
                "cache reads, cache writes and audio input cannot exceed input_tokens (which include them)",
            )
        audio_out = self.audio_output_tokens
        if audio_out and self.reasoning_output_tokens + audio_out > self.output_tokens:
            raise ValidationError(
                "usage.audio_output_tokens",
                "reasoning plus audio output cannot exceed output_tokens (which include them)",
            )
        _require_retried_tokens(self)
        for name in ("unpriced", "billed_unreported"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(f"usage.{name}", f"must be a boolean, got {shown(getattr(self, name))}")
        if self.billed_unreported and not self.unpriced:
            raise ValidationError(
                "usage.billed_unreported", "needs unpriced: what was not reported has no known cost"
            )
        for name in ("cost_usd", "retried_cost_usd"):
            cost = getattr(self, name)
            if not isinstance(cost, Decimal) or not cost.is_finite() or cost < 0:
                raise ValidationError(f"usage.{name}", f"must be a finite Decimal >= 0, got {shown(cost)}")
            if cost.is_signed():  # -0 (cost < 0 is refused): zero, written without its sign
                object.__setattr__(self, name, cost.copy_abs())
        latency = self.latency_ms
        if (
            isinstance(latency, bool)
            or not isinstance(latency, int | float)
            or not -math.inf < latency < math.inf  # (math.isfinite raises OverflowError past a float)
            or latency < 0
        ):
            raise ValidationError("usage.latency_ms", f"must be a number >= 0, got {shown(latency)}")
        if isinstance(latency, float) and latency == 0.0:
            object.__setattr__(self, "latency_ms", 0.0)  # -0.0 too: answered as "-0.0" before
        reasons = self.finish_reasons
        if (
            isinstance(reasons, str)
            or not isinstance(reasons, list | tuple)
            or not all(isinstance(r, str) for r in reasons)
        ):
            raise ValidationError("usage.finish_reasons", f"must be a list of strings, got {shown(reasons)}")
        _require_plain_object("usage.extra", self.extra)
        object.__setattr__(self, "finish_reasons", tuple(reasons))

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def billed_tokens(self, name: str) -> int:
        """The tokens of kind ``name`` (a ``TOKEN_FIELDS`` name) of every attempt the call was
        billed for: the answer's and the retried attempts' (``retried_tokens``), the tokens
        ``charged_usd`` paid for. Another name is a ValidationError (it was an AttributeError,
        or for ``"provider"`` a string added to an int)."""
        if not isinstance(name, str) or name not in _TOKEN_FIELD_NAMES:
            raise ValidationError("name", f"must be one of {', '.join(TOKEN_FIELDS)}, got {shown(name)}")
        own: int = getattr(self, name)
        return own + self.retried_tokens.get(name, 0)

    @property
    def charged_usd(self) -> Decimal:
        """Everything the call was billed: the reply's cost and the retried attempts', exactly
        (``EXACT``, whatever the thread's decimal context)."""
        return exact_sum(self.cost_usd, self.retried_cost_usd)

    def to_dict(self) -> JsonObject:
        """A JSON-ready dict (costs as strings, to keep them exact).

        The later fields appear only when set, so a state that an older release recorded
        reads back the same (``tests/fixtures``).
        """
        data: JsonObject = {
            "provider": self.provider,
            "request_model": self.request_model,
            "response_model": self.response_model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "reasoning_output_tokens": self.reasoning_output_tokens,
            "finish_reasons": list(self.finish_reasons),
            "response_id": self.response_id,
            "cost_usd": plain_decimal(self.cost_usd),
            "price_version": self.price_version,
            "latency_ms": self.latency_ms,
            "attempts": self.attempts,
            "extra": self.extra,
        }
        for name, default in _LATER_FIELDS:
            value = getattr(self, name)
            if value != default:
                data[name] = plain_decimal(value) if isinstance(value, Decimal) else value
        return data

    @classmethod
    def from_dict(cls, data: JsonObject) -> LlmUsage:
        """Inverse of ``to_dict``; unknown keys are rejected, and so is a value that is no
        field's (a ValidationError naming it, as the constructor's: a cost that is no number was
        ``decimal.InvalidOperation``, finish reasons that are no list a ``TypeError``)."""
        if not isinstance(data, dict):
            raise ValidationError("usage", f"must be an object of usage fields, got {shown(data)}")
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValidationError("usage", f"unknown fields {sorted(map(str, unknown))}")
        values = dict(data)
        for name in ("cost_usd", "retried_cost_usd"):
            if name in values:
                values[name] = _decimal_of(f"usage.{name}", values[name])
        if isinstance(values.get("finish_reasons"), list):
            values["finish_reasons"] = tuple(values["finish_reasons"])
        return cls(**values)


_TOKEN_FIELD_NAMES = frozenset(TOKEN_FIELDS)
"""``billed_tokens``' names, looked up on every step a session folds."""

_LATER_FIELDS: tuple[tuple[str, Any], ...] = (
    ("cache_creation_input_tokens", 0),
    ("cache_creation_1h_input_tokens", 0),
    ("unpriced", False),
    ("cost_source", ""),
    ("retried_cost_usd", Decimal("0")),
    ("billed_unreported", False),
    ("audio_input_tokens", 0),
    ("audio_output_tokens", 0),
    ("retried_tokens", {}),
)
"""LlmUsage fields added after release 0.1.0, with their defaults."""


def _decimal_of(field_name: str, value: Any) -> Decimal:
    """A cost as ``to_dict`` writes it (a string) or JSON reads it (a number), exactly."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            return Decimal(str(value))
        except (ArithmeticError, ValueError):  # InvalidOperation; an int too long for str()
            pass
    raise ValidationError(field_name, f"must be a decimal amount, got {shown(value)}")


def _require_retried_tokens(usage: LlmUsage) -> None:
    """``retried_tokens`` maps token field names to counts >= 0; kept in ``TOKEN_FIELDS`` order
    without zeros, so that one usage has one stored form."""
    given = usage.retried_tokens
    if not isinstance(given, dict):
        raise ValidationError(
            "usage.retried_tokens", f"must be an object of token counts, got {shown(given)}"
        )
    unknown = sorted(str(name) for name in given if name not in TOKEN_FIELDS)
    if unknown:
        raise ValidationError(
            "usage.retried_tokens", f"unknown token fields {unknown}: one of {', '.join(TOKEN_FIELDS)}"
        )
    for name, count in given.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValidationError(f"usage.retried_tokens.{name}", f"must be an int >= 0, got {shown(count)}")
    object.__setattr__(
        usage, "retried_tokens", {name: given[name] for name in TOKEN_FIELDS if given.get(name)}
    )


_PLAIN_JSON = json.JSONEncoder(allow_nan=False)
"""Built once: ``json.dumps`` with any option builds a new encoder on every call."""


def plain_decimal(value: Decimal) -> str:
    """``value`` as text without an exponent (``0.0000001``, not ``str``'s ``1E-7``; a zero at
    seven places ``0.0000000``, not ``0E-7``): the one way money is written out for JSON."""
    return format(value, "f")


def exact_decimal(value: Decimal, places: int, *, sign: bool = False, grouping: bool = False) -> str:
    """``value`` with at least ``places`` decimals and every further one it has, never rounded:
    how money is shown to a person (the CLI's tables, the page's tiles), where a fixed number
    of places showed a day of $0.00004 as 0.0000. ``sign`` writes ``+`` before a positive
    value, ``grouping`` separates thousands."""
    with localcontext(EXACT):  # normalize() rounds to the context: 28 digits by default
        exponent = value.normalize().as_tuple().exponent
    shown = max(places, -exponent) if isinstance(exponent, int) else places
    return f"{value:{'+' if sign else ''}{',' if grouping else ''}.{shown}f}"


def _require_plain_object(field_name: str, value: Any) -> None:
    """The shape check a decoded value also passes: a JSON-serialisable dict with string keys.

    Stored events are decoded through ``LlmUsage.__post_init__``, so only this check runs
    there; the bounds of ``require_json`` are for commands (``require_usage``), so that a
    stricter rule never stops an old event from loading.
    """
    if not isinstance(value, dict):
        raise ValidationError(field_name, "must be a JSON object")
    try:
        _PLAIN_JSON.encode(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise ValidationError(field_name, f"must be JSON-serialisable: {error}") from None


MAX_TOKENS = 10**12
"""Tokens of one kind in one call."""
MAX_ATTEMPTS = 1_000
"""Attempts of one call."""
MAX_LATENCY_MS = 86_400_000.0
"""One call's latency: a day."""
MAX_FINISH_REASONS = 64
USAGE_TEXT_LIMITS: tuple[tuple[str, int], ...] = (
    ("provider", MAX_NAME_LENGTH),
    ("request_model", MAX_NAME_LENGTH),
    ("response_model", MAX_NAME_LENGTH),
    ("cost_source", MAX_NAME_LENGTH),
    ("response_id", 1_000),
    ("price_version", 1_000),
)
"""LlmUsage's text fields, in the order they are checked, and the characters each may hold:
names up to ``MAX_NAME_LENGTH`` (200), provider-made ids up to 1,000. ``require_usage``
checks them, and ``storable_usage`` cuts a reply's texts to them."""


def require_usage(field_name: str, usage: Any, *, least_attempts: int = 0) -> LlmUsage | None:
    """Raise ValidationError unless ``usage`` is None or an LlmUsage within bounds a command takes.

    Beyond ``LlmUsage``'s own checks: strings storable in PostgreSQL (names at most 200
    characters, ids 1,000), token counts at most 10^12, attempts at most 1,000 and at least
    ``least_attempts`` (1 for an answer; a failure may have made none: a call the open breaker
    refused sent no request), latency at most a day, cost at most 10^9 USD with at most 40
    decimal places, and ``extra`` within the JSON bounds.
    """
    if usage is None:
        return None
    if not isinstance(usage, LlmUsage):
        raise ValidationError(field_name, "must be an LlmUsage")
    if _plainly_within_bounds(usage) and usage.attempts >= least_attempts:
        return usage  # every step's usage passes here: the careful checks below name a fault
    for name, limit in USAGE_TEXT_LIMITS:
        text = getattr(usage, name)
        if text:
            require_text(f"{field_name}.{name}", text, max_length=limit)
    for name in TOKEN_FIELDS:
        require_count(f"{field_name}.{name}", getattr(usage, name), most=MAX_TOKENS)
    for name, count in usage.retried_tokens.items():
        require_count(f"{field_name}.retried_tokens.{name}", count, most=MAX_TOKENS)
    require_count(f"{field_name}.attempts", usage.attempts, least=least_attempts, most=MAX_ATTEMPTS)
    if usage.latency_ms > MAX_LATENCY_MS:
        raise ValidationError(f"{field_name}.latency_ms", f"must be at most {MAX_LATENCY_MS:.0f} (a day)")
    for name in ("cost_usd", "retried_cost_usd"):
        cost = getattr(usage, name)
        exponent = cost.as_tuple().exponent
        if cost > MAX_COST_USD or (isinstance(exponent, int) and exponent < -MAX_COST_DECIMALS):
            raise ValidationError(
                f"{field_name}.{name}",
                f"must be at most {MAX_COST_USD} with at most {MAX_COST_DECIMALS} decimal places",
            )
    if len(usage.finish_reasons) > MAX_FINISH_REASONS:
        raise ValidationError(
            f"{field_name}.finish_reasons", f"must hold at most {MAX_FINISH_REASONS} reasons"
        )
    for reason in usage.finish_reasons:
        require_text(f"{field_name}.finish_reasons", reason, max_length=MAX_NAME_LENGTH)
    require_object(f"{field_name}.extra", usage.extra)
    return usage


COST_SOURCES = ("", "provider")
"""What a caller's usage may say of its cost: nothing (priced by the table, repriced with it),
or that it is the provider's own charge (never repriced)."""

USAGE_NAMES = ("provider", "request_model", "response_model", "cost_source")
"""LlmUsage's texts that name something: held to a name's rule when a caller gives them."""
_TRIMMED_NAMES = frozenset(name for name in USAGE_NAMES if name != "cost_source")
"""The names a caller gives with no space around them: the models, and the provider."""


def require_given_usage(field_name: str, usage: Any) -> None:
    """Raise ValidationError unless a usage a caller gives (``record_step``: the call happened
    elsewhere) holds no control character in its texts: its names (``USAGE_NAMES``) and finish
    reasons are names (``require_name``), its models and provider with no space around them (the
    provider not empty either), its response id
    and price version hold no control character either; its ``cost_source`` is one of
    ``COST_SOURCES``.

    Only ``require_usage`` held them, which takes any storable text: ``request_model="gpt\\nx"``
    was recorded over the library and REST, while every other name a caller gives refuses it
    (``record_step``'s step, ``process_step``'s model). A usage a provider reported is not held
    to this (``process_step``): the call was made and billed, and its model is kept as
    reported, shown with its controls escaped (``bounds.spell_controls``).
    """
    if not isinstance(usage, LlmUsage):
        return  # None, or refused by require_usage in its words
    if not usage.provider:
        # (Its default is "unknown": an empty one was recorded, a provider named by nothing.)
        raise ValidationError(f"{field_name}.provider", "must name the provider (leave it out for 'unknown')")
    for name in USAGE_NAMES:
        text = getattr(usage, name)
        if text and not (text.isascii() and text.isprintable()):
            require_name(f"{field_name}.{name}", text)
        if name in _TRIMMED_NAMES and text != text.strip():
            # As a step's model (``require_model``): the price table reads " gpt-4.1" trimmed,
            # while the dashboard and a model budget kept it apart from "gpt-4.1" (and the
            # dashboard "openai " apart from "openai").
            raise ValidationError(f"{field_name}.{name}", f"must have no space around it, got {text!r}")
    for reason in usage.finish_reasons:
        if isinstance(reason, str) and not (reason.isascii() and reason.isprintable()):
            require_name(f"{field_name}.finish_reasons", reason)
    for name in ("response_id", "price_version"):
        text = getattr(usage, name)
        if not (text.isascii() and text.isprintable()):  # (the field's name is spelt only then)
            require_no_controls(f"{field_name}.{name}", text)
    if usage.cost_source not in COST_SOURCES:
        # Only "provider" keeps a cost from repricing: "Provider" was recorded, then repriced.
        raise ValidationError(
            f"{field_name}.cost_source",
            "must be 'provider' (the cost is the provider's own charge) or empty,"
            f" got {shown(usage.cost_source)}",
        )


def _plainly_within_bounds(usage: LlmUsage) -> bool:
    """True when ``require_usage``'s checks all pass, decided without building field names."""
    for name, limit in _PLAIN_TEXTS:
        text = getattr(usage, name)
        if text and not plainly_text(text, limit):
            return False
    if usage.retried_cost_usd or usage.cost_source or usage.retried_tokens:
        return False  # rare: the careful path checks them
    # Loops, not ``any``/``all`` over generators: every step's usage passes here, and a
    # generator's frame cost more than the checks it ran.
    for count in (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_input_tokens,
        usage.reasoning_output_tokens,
        usage.cache_creation_input_tokens,
    ):
        if type(count) is not int or not 0 <= count <= MAX_TOKENS:
            return False
    if type(usage.attempts) is not int or not 0 <= usage.attempts <= MAX_ATTEMPTS:
        return False
    exponent = usage.cost_usd.as_tuple().exponent
    if not (
        usage.latency_ms <= MAX_LATENCY_MS
        and usage.cost_usd <= MAX_COST_USD
        and not (isinstance(exponent, int) and exponent < -MAX_COST_DECIMALS)
        and len(usage.finish_reasons) <= MAX_FINISH_REASONS
    ):
        return False
    for reason in usage.finish_reasons:
        if not plainly_text(reason, MAX_NAME_LENGTH):
            return False
    return not usage.extra  # anything in extra takes the careful path (its JSON bounds)


_PLAIN_TEXTS = tuple((name, limit) for name, limit in USAGE_TEXT_LIMITS if name != "cost_source")
"""The texts the plain path checks: a ``cost_source``, when set, sends a usage the careful way."""


# -- the key filter --------------------------------------------------------------------
#
# A blocked Bloom filter of every idempotency key a session processed, so that its state
# stays bounded yet a never-seen key is known at once. Held as plain JSON, a list of 64
# strings of 342 base64 digits (6 bits each), so that snapshots need no transcoding of
# their own. A key's 7 bits all lie in one string (chosen by its hash): adding it rebuilds
# one 342-byte string, ~4.5 us a key with the hash, where 7 bits spread over the whole
# filter cost ~12 us (measured; false positives 0.23 % instead of 0.20 % at 10,000 keys).

KEY_FILTER_CHUNKS = 64
KEY_FILTER_CHUNK_DIGITS = 342
KEY_FILTER_HASHES = 7
_CHUNK_BITS = KEY_FILTER_CHUNK_DIGITS * 6
KEY_FILTER_BITS = KEY_FILTER_CHUNKS * _CHUNK_BITS
"""131,328 bits (16 KiB); about 22 KB as JSON."""
_DIGITS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_WITH_BIT = [
    bytes(_DIGITS[_DIGITS.index(c) | 1 << bit] if c in _DIGITS else c for c in range(256)) for bit in range(6)
]
"""Per bit: digit byte -> the digit byte with that bit set."""
_HAS_BIT = [bytes(c in _DIGITS and _DIGITS.index(c) >> bit & 1 for c in range(256)) for bit in range(6)]
"""Per bit: digit byte -> 1 if that bit is set."""
_EMPTY_CHUNK = "A" * KEY_FILTER_CHUNK_DIGITS
_EIGHT_WORDS = struct.Struct("<8I").unpack

KeyFilter = list[str]
"""A key filter; ``[]`` is the empty one (a session without keys carries no bitmap)."""


def _words(key: str) -> tuple[int, ...]:
    """The chunk (first word) and the 7 bit positions in it (the others) of a key."""
    return _EIGHT_WORDS(blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32).digest())


def key_filter_with(key_filter: KeyFilter, key: str) -> KeyFilter:
    """A copy of ``key_filter`` that also holds ``key`` (the argument is left unchanged)."""
    chunks = list(key_filter) if key_filter else [_EMPTY_CHUNK] * KEY_FILTER_CHUNKS
    chunk, *positions = _words(key)
    chunk %= KEY_FILTER_CHUNKS
    digits = bytearray(chunks[chunk], "ascii")
    for position in positions:
        at, bit = divmod(position % _CHUNK_BITS, 6)
        digits[at] = _WITH_BIT[bit][digits[at]]
    chunks[chunk] = digits.decode("ascii")
    return chunks


def key_filter_within(smaller: KeyFilter, larger: KeyFilter) -> bool:
    """Whether every key ``smaller`` may hold, ``larger`` may hold too (each bit of one is set
    in the other); False for filters of another shape, or digits that are no filter's."""
    if not smaller:
        return True
    if not larger or len(smaller) != len(larger):
        return False
    for mine, theirs in zip(smaller, larger, strict=True):
        if len(mine) != len(theirs):
            return False
        for a, b in zip(mine.encode("ascii", "replace"), theirs.encode("ascii", "replace"), strict=True):
            if a not in _DIGITS or b not in _DIGITS:
                return False
            bits = _DIGITS.index(a)
            if bits & _DIGITS.index(b) != bits:
                return False
    return True


def key_filter_may_hold(key_filter: KeyFilter, key: str) -> bool:
    """False if ``key`` was definitely never added; True if it probably was."""
    if not key_filter:
        return False
    chunk, *positions = _words(key)
    digits = key_filter[chunk % KEY_FILTER_CHUNKS]
    for position in positions:
        at, bit = divmod(position % _CHUNK_BITS, 6)
        if not _HAS_BIT[bit][ord(digits[at])]:
            return False
    return True
