"""The one pricing rule: what a model call's tokens cost at a model's prices, exactly (Decimal).

The LLM adapter prices each call with it (``adapters/llm``) and the projections reprice
recorded usage with it (``projections/cost_queries``); no other module multiplies tokens
by prices. Loading a price file is I/O and stays in the adapter (``load_price_table``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from flowledger.domain.errors import UnknownModelPrice, ValidationError

_PRICE_FIELDS = (
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "output_cost_per_reasoning_token",
)


@dataclass(frozen=True, kw_only=True)
class TokenCounts:
    """A call's tokens as OpenAI reports them: ``input_tokens`` include the cached ones and
    ``output_tokens`` the reasoning ones."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(name, f"must be an int >= 0, got {value!r}")
        if not 0 <= self.cache_read_input_tokens <= self.input_tokens:
            raise ValidationError("cache_read_input_tokens", "must be between 0 and input_tokens")
        if not 0 <= self.reasoning_output_tokens <= self.output_tokens:
            raise ValidationError("reasoning_output_tokens", "must be between 0 and output_tokens")


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """USD per token for each token type; cached input and reasoning fall back to their base."""

    input_cost_per_token: Decimal
    output_cost_per_token: Decimal
    cache_read_input_token_cost: Decimal | None = None
    output_cost_per_reasoning_token: Decimal | None = None

    def __post_init__(self) -> None:
        for name in _PRICE_FIELDS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Decimal) or not value >= 0):
                raise ValidationError(f"price.{name}", f"must be a Decimal >= 0, got {value!r}")

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_read_input_tokens: int = 0,
        reasoning_output_tokens: int = 0,
    ) -> Decimal:
        """The exact cost of one call (see ``cost_of``)."""
        tokens = TokenCounts(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_input_tokens=cache_read_input_tokens,
            reasoning_output_tokens=reasoning_output_tokens,
        )
        return cost_of(tokens, self)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ModelPrice:
        """A price from one LiteLLM-format entry (extra keys are ignored)."""

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
        return cls(
            input_cost_per_token=input_cost,
            output_cost_per_token=output_cost,
            cache_read_input_token_cost=amount("cache_read_input_token_cost"),
            output_cost_per_reasoning_token=amount("output_cost_per_reasoning_token"),
        )


def cost_of(tokens: TokenCounts, price: ModelPrice) -> Decimal:
    """What ``tokens`` cost at ``price``: each token type at its own rate, never on the total.

    Cached input is split out of ``input_tokens`` and reasoning out of ``output_tokens``
    before pricing. The rule is linear, so the cost of summed counts is the sum of costs.
    """
    cached = price.cache_read_input_token_cost
    reasoning = price.output_cost_per_reasoning_token
    cost = (tokens.input_tokens - tokens.cache_read_input_tokens) * price.input_cost_per_token
    cost += tokens.cache_read_input_tokens * (cached if cached is not None else price.input_cost_per_token)
    cost += (tokens.output_tokens - tokens.reasoning_output_tokens) * price.output_cost_per_token
    cost += tokens.reasoning_output_tokens * (
        reasoning if reasoning is not None else price.output_cost_per_token
    )
    return cost


def model_names(model: str) -> tuple[str, ...]:
    """The names a model's price may be found under: itself, then without a ``provider/`` prefix."""
    bare = model.rsplit("/", 1)[-1]
    return (model,) if bare == model else (model, bare)


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices by model name, under one version that every recorded cost cites."""

    version: str
    prices: Mapping[str, ModelPrice]
    default: ModelPrice | None = field(default=None)

    def price_for(self, model: str) -> ModelPrice:
        """The model's price (``provider/model`` also matches ``model``), else the default."""
        for name in model_names(model):
            if name in self.prices:
                return self.prices[name]
        if self.default is not None:
            return self.default
        raise UnknownModelPrice(model, self.version)

    def knows(self, model: str) -> bool:
        """Whether ``model`` has a price (its own or the default)."""
        try:
            self.price_for(model)
        except UnknownModelPrice:
            return False
        return True

    def estimate(self, model: str, *, input_tokens: int, output_tokens: int) -> Decimal:
        """The expected cost of a call of this size, without cache or reasoning discounts."""
        return self.price_for(model).cost(input_tokens=input_tokens, output_tokens=output_tokens)
