"""The pricing rule: what a model call's tokens cost at a model's prices, exactly (Decimal).

Import it from ``flowledger.domain.pricing``, which also holds the table (``PriceTable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
    Overflow,
    localcontext,
)
from typing import Any

from flowledger.domain.errors import ValidationError

LONG_CONTEXT_TOKENS = 200_000
"""A call whose input (cached and cache writes included) exceeds this many tokens is priced at
the ``…_above_200k_tokens`` rates where the model has them (LiteLLM's rule)."""


EXACT = Context(
    prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[InvalidOperation, DivisionByZero, Overflow]
)
"""The context money is added and multiplied in: no rounding at all (a product has at most the
digits of its factors), whatever the thread's context says. Under the thread's own, an embedding
service's ``getcontext().prec = 6`` made a $1.524596 call cost $1.52460, and the default 28
digits dropped the last digit of 987,654,321,987 tokens at a 17-digit price."""

exact_sum = EXACT.copy().add
"""``exact_sum(a, b)``: ``a + b`` under ``EXACT``, the same Decimal as ``with localcontext(EXACT):
a + b`` without copying the context and swapping the thread's out and back for one sum (1.2 µs
against 0.1 µs, ``timeit``; every recorded step adds three). A copy of its own, so that the
flags of its sums (an exact sum raises none) never land on ``EXACT``."""


@dataclass(frozen=True, kw_only=True)
class TokenCounts:
    """A call's tokens as OpenAI reports them: ``input_tokens`` include the cache reads, the
    cache writes and the audio input, ``output_tokens`` the reasoning and the audio output.
    ``cache_creation_1h_input_tokens`` is the part of ``cache_creation_input_tokens`` written
    with a one-hour lifetime. ``audio_input_tokens`` are the uncached audio input tokens (apart
    from the cache reads and writes), ``audio_output_tokens`` the audio output (apart from the
    reasoning)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    audio_input_tokens: int = 0
    audio_output_tokens: int = 0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(item.name, f"must be an int >= 0, got {value!r}")
        if self.cache_read_input_tokens > self.input_tokens:
            raise ValidationError("cache_read_input_tokens", "must be between 0 and input_tokens")
        if self.reasoning_output_tokens > self.output_tokens:
            raise ValidationError("reasoning_output_tokens", "must be between 0 and output_tokens")
        if self.cache_read_input_tokens + self.cache_creation_input_tokens > self.input_tokens:
            raise ValidationError(
                "cache_creation_input_tokens", "cache reads plus cache writes cannot exceed input_tokens"
            )
        if self.cache_creation_1h_input_tokens > self.cache_creation_input_tokens:
            raise ValidationError(
                "cache_creation_1h_input_tokens", "must be between 0 and cache_creation_input_tokens"
            )
        cached = self.cache_read_input_tokens + self.cache_creation_input_tokens
        if cached + self.audio_input_tokens > self.input_tokens:
            raise ValidationError(
                "audio_input_tokens", "cache reads, cache writes and audio input cannot exceed input_tokens"
            )
        if self.reasoning_output_tokens + self.audio_output_tokens > self.output_tokens:
            raise ValidationError(
                "audio_output_tokens", "reasoning plus audio output cannot exceed output_tokens"
            )


TOKEN_FIELDS: tuple[str, ...] = tuple(item.name for item in fields(TokenCounts))
"""The token counts a call has, in ``TokenCounts``' order (``LlmUsage`` carries the same names)."""


_REQUIRED = ("input_cost_per_token", "output_cost_per_token")
MAX_COST_DECIMALS = 40
"""The most decimal places a recorded cost has (``domain.values.require_usage``), and so a price:
tokens are whole, so a call's cost has its prices' decimal places."""
MAX_COST_USD = Decimal(10**9)
"""The most one call may cost (``domain.values.require_usage``), and so one token's price."""


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """USD per token for each token type, under LiteLLM's key names.

    Only the input and output prices are required. A missing rate falls back: cache reads and
    five-minute cache writes to the input rate, one-hour writes to the five-minute rate,
    reasoning to the output rate, audio input and output to the (text) input and output rates,
    and each ``…_above_200k_tokens`` rate to its base rate.
    """

    input_cost_per_token: Decimal
    output_cost_per_token: Decimal
    cache_read_input_token_cost: Decimal | None = None
    output_cost_per_reasoning_token: Decimal | None = None
    cache_creation_input_token_cost: Decimal | None = None
    cache_creation_input_token_cost_above_1hr: Decimal | None = None
    input_cost_per_token_above_200k_tokens: Decimal | None = None
    output_cost_per_token_above_200k_tokens: Decimal | None = None
    cache_read_input_token_cost_above_200k_tokens: Decimal | None = None
    cache_creation_input_token_cost_above_200k_tokens: Decimal | None = None
    cache_creation_input_token_cost_above_1hr_above_200k_tokens: Decimal | None = None
    input_cost_per_audio_token: Decimal | None = None
    output_cost_per_audio_token: Decimal | None = None

    def __post_init__(self) -> None:
        for name in ("input_cost_per_token", "output_cost_per_token"):
            if getattr(self, name) is None:  # (None was taken, and every call priced then failed)
                raise ValidationError(f"price.{name}", "must be a Decimal, got None")
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and not isinstance(value, Decimal):
                raise ValidationError(f"price.{item.name}", f"must be a Decimal, got {value!r}")
            if value is not None and not value.is_finite():
                # NaN raised InvalidOperation at this comparison; Infinity passed it, and every
                # call to the model then raised InvalidOperation when it was priced.
                raise ValidationError(f"price.{item.name}", f"must be a finite number, got {value}")
            if value is not None and not value >= 0:
                raise ValidationError(f"price.{item.name}", f"must be >= 0, got {value}")
            if value is not None and value > MAX_COST_USD:
                # 1e999999 was taken: prices show then stopped on decimal.Overflow (exit 70), and
                # every call of the model cost more than a cost may be recorded as, after it was paid.
                raise ValidationError(
                    f"price.{item.name}", f"must be at most {MAX_COST_USD} (a call's most), got {value}"
                )
            exponent = value.as_tuple().exponent if value is not None else 0
            if isinstance(exponent, int) and exponent < -MAX_COST_DECIMALS:
                # Taken, every call the model answered was then refused as a cost that cannot
                # be recorded, after it was made and paid.
                raise ValidationError(
                    f"price.{item.name}",
                    f"must have at most {MAX_COST_DECIMALS} decimal places (as a recorded cost), got {value}",
                )

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_read_input_tokens: int = 0,
        reasoning_output_tokens: int = 0,
        cache_creation_input_tokens: int = 0,
        cache_creation_1h_input_tokens: int = 0,
        audio_input_tokens: int = 0,
        audio_output_tokens: int = 0,
    ) -> Decimal:
        """The exact cost of one call (see ``cost_of``)."""
        tokens = TokenCounts(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_input_tokens=cache_read_input_tokens,
            reasoning_output_tokens=reasoning_output_tokens,
            cache_creation_input_tokens=cache_creation_input_tokens,
            cache_creation_1h_input_tokens=cache_creation_1h_input_tokens,
            audio_input_tokens=audio_input_tokens,
            audio_output_tokens=audio_output_tokens,
        )
        return cost_of(tokens, self)

    def most(self, *, input_tokens: int, output_tokens: int) -> Decimal:
        """The most a call of ``input_tokens`` in and at most ``output_tokens`` out can cost,
        whatever the provider then reports them as: the input all at the dearest input-side
        type (plain, cache read, a five-minute or one-hour cache write, audio), the output all
        at the dearest of output, reasoning and audio. A one-hour cache write costs twice the
        input at Anthropic: a prompt the provider writes to the cache priced at the input rate
        held half of what it cost (``OpenAICompatibleClient.max_cost``); audio input costs 16
        times the text input at OpenAI's gpt-4o-audio-preview."""
        n, m = input_tokens, output_tokens
        inputs: tuple[dict[str, int], ...] = (
            {},  # plain input
            {"cache_read_input_tokens": n},
            {"cache_creation_input_tokens": n},
            {"cache_creation_input_tokens": n, "cache_creation_1h_input_tokens": n},
            {"audio_input_tokens": n},
        )
        outputs: tuple[dict[str, int], ...] = (
            {},  # plain output
            {"reasoning_output_tokens": m},
            {"audio_output_tokens": m},
        )
        return max(
            self.cost(input_tokens=n, output_tokens=m, **split, **said)
            for split in inputs
            for said in outputs
        )

    @property
    def has_long_context_tier(self) -> bool:
        """Whether any ``…_above_200k_tokens`` rate is set."""
        return any(
            getattr(self, item.name) is not None
            for item in fields(self)
            if item.name.endswith("_200k_tokens")
        )

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ModelPrice:
        """A price from one LiteLLM-format entry (keys it does not price are ignored)."""

        def amount(key: str) -> Decimal | None:
            value = entry.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
                raise ValidationError(f"price.{key}", f"must be a number, got {value!r}")
            try:
                return Decimal(str(value))
            except ArithmeticError:
                raise ValidationError(f"price.{key}", f"must be a number, got {value!r}") from None

        input_cost, output_cost = amount("input_cost_per_token"), amount("output_cost_per_token")
        if input_cost is None or output_cost is None:
            raise ValidationError("price", "needs input_cost_per_token and output_cost_per_token")
        rates = {item.name: amount(item.name) for item in fields(cls) if item.name not in _REQUIRED}
        return cls(input_cost_per_token=input_cost, output_cost_per_token=output_cost, **rates)


def _first(*rates: Decimal | None) -> Decimal:
    return next(rate for rate in rates if rate is not None)


def cost_of(tokens: TokenCounts, price: ModelPrice, *, long_context: bool | None = None) -> Decimal:
    """What ``tokens`` cost at ``price``: each token type at its own rate, never on the total.

    Cache reads, cache writes and audio are split out of ``input_tokens``, and reasoning and
    audio out of ``output_tokens``, before pricing. Above ``LONG_CONTEXT_TOKENS`` input tokens every type
    takes its long-context rate where the model has one. Within a tier the rule is linear:
    the cost of summed counts is the sum of costs, when ``long_context`` says which tier
    the calls summed were in (None: decide from ``tokens``, one call's counts).
    """
    with localcontext(EXACT):
        return _cost_of(tokens, price, long_context)


def _cost_of(tokens: TokenCounts, price: ModelPrice, long_context: bool | None) -> Decimal:
    p = price
    if long_context is None:
        long_context = tokens.input_tokens > LONG_CONTEXT_TOKENS
    long = long_context and p.has_long_context_tier

    def rate(long_rate: Decimal | None, *base: Decimal | None) -> Decimal:
        return _first(long_rate if long else None, *base)

    input_rate = rate(p.input_cost_per_token_above_200k_tokens, p.input_cost_per_token)
    output_rate = rate(p.output_cost_per_token_above_200k_tokens, p.output_cost_per_token)
    read_rate = rate(
        p.cache_read_input_token_cost_above_200k_tokens, p.cache_read_input_token_cost, input_rate
    )
    write_rate = rate(
        p.cache_creation_input_token_cost_above_200k_tokens, p.cache_creation_input_token_cost, input_rate
    )
    write_1h_rate = rate(
        p.cache_creation_input_token_cost_above_1hr_above_200k_tokens,
        p.cache_creation_input_token_cost_above_1hr,
        write_rate,
    )
    reasoning_rate = _first(p.output_cost_per_reasoning_token, output_rate)
    audio_in_rate = _first(p.input_cost_per_audio_token, input_rate)
    audio_out_rate = _first(p.output_cost_per_audio_token, output_rate)
    written_1h = tokens.cache_creation_1h_input_tokens
    written_5m = tokens.cache_creation_input_tokens - written_1h
    audio_in, audio_out = tokens.audio_input_tokens, tokens.audio_output_tokens
    uncached = tokens.input_tokens - tokens.cache_read_input_tokens - tokens.cache_creation_input_tokens
    cost = (uncached - audio_in) * input_rate + audio_in * audio_in_rate
    cost += tokens.cache_read_input_tokens * read_rate
    cost += written_5m * write_rate + written_1h * write_1h_rate
    cost += (tokens.output_tokens - tokens.reasoning_output_tokens - audio_out) * output_rate
    cost += tokens.reasoning_output_tokens * reasoning_rate + audio_out * audio_out_rate
    return cost


def retried_cost_of(retried_tokens: Mapping[str, int], price: ModelPrice, *, input_tokens: int) -> Decimal:
    """What the retried attempts of a call cost at ``price``, from their summed counts
    (``LlmUsage.retried_tokens``). A retry resends the answer's request, so the attempts are
    priced in the answer's tier (``input_tokens``, the answer's): decided from the sum, two
    attempts of 150,000 input tokens each would take the long-context rates. A count the rule
    cannot read raises ``ValidationError``."""
    counts = TokenCounts(**{name: retried_tokens.get(name, 0) for name in TOKEN_FIELDS})
    return cost_of(counts, price, long_context=input_tokens > LONG_CONTEXT_TOKENS)
