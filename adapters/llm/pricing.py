"""Prices per token type, in LiteLLM's key format, and exact (Decimal) call costs.

The shipped table (``prices.json``) has a ``version``, its ``sources`` and a ``models``
map; ``FLOWLEDGER_PRICING_FILE`` may point at one like it or at LiteLLM's own
``model_prices_and_context_window.json`` (a flat map of model to entry; its version
is then the file's name and content hash). A table may carry a ``default`` entry;
without one an unknown model raises UnknownModelPrice rather than costing $0.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from flowledger.domain.errors import UnknownModelPrice, ValidationError

SHIPPED_FILE = "prices.json"


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """USD per token for each token type; cached input and reasoning fall back to their base."""

    input_cost_per_token: Decimal
    output_cost_per_token: Decimal
    cache_read_input_token_cost: Decimal | None = None
    output_cost_per_reasoning_token: Decimal | None = None

    def __post_init__(self) -> None:
        for name in (
            "input_cost_per_token",
            "output_cost_per_token",
            "cache_read_input_token_cost",
            "output_cost_per_reasoning_token",
        ):
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
        """The exact cost of one call.

        ``input_tokens`` includes the cached ones and ``output_tokens`` the reasoning
        ones (as OpenAI reports them), so each is split before pricing.
        """
        if not 0 <= cache_read_input_tokens <= input_tokens:
            raise ValidationError("cache_read_input_tokens", "must be between 0 and input_tokens")
        if not 0 <= reasoning_output_tokens <= output_tokens:
            raise ValidationError("reasoning_output_tokens", "must be between 0 and output_tokens")
        cached_price = self.cache_read_input_token_cost
        reasoning_price = self.output_cost_per_reasoning_token
        cost = (input_tokens - cache_read_input_tokens) * self.input_cost_per_token
        cost += cache_read_input_tokens * (
            cached_price if cached_price is not None else self.input_cost_per_token
        )
        cost += (output_tokens - reasoning_output_tokens) * self.output_cost_per_token
        cost += reasoning_output_tokens * (
            reasoning_price if reasoning_price is not None else self.output_cost_per_token
        )
        return cost

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> ModelPrice:
        """A price from one LiteLLM-format entry (extra keys are ignored)."""

        def amount(key: str) -> Decimal | None:
            value = entry.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
                raise ValidationError(f"price.{key}", f"must be a number, got {value!r}")
            return Decimal(str(value))

        input_cost, output_cost = amount("input_cost_per_token"), amount("output_cost_per_token")
        if input_cost is None or output_cost is None:
            raise ValidationError("price", "needs input_cost_per_token and output_cost_per_token")
        return cls(
            input_cost_per_token=input_cost,
            output_cost_per_token=output_cost,
            cache_read_input_token_cost=amount("cache_read_input_token_cost"),
            output_cost_per_reasoning_token=amount("output_cost_per_reasoning_token"),
        )


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices by model name, under one version that every recorded cost cites."""

    version: str
    prices: dict[str, ModelPrice]
    default: ModelPrice | None = None

    def price_for(self, model: str) -> ModelPrice:
        """The model's price (``provider/model`` also matches ``model``), else the default."""
        for name in (model, model.rsplit("/", 1)[-1]):
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


def load_price_table(path: Path | None = None, *, default: ModelPrice | None = None) -> PriceTable:
    """The table in ``path``, or the shipped one; ``default`` prices models the file lacks."""
    if path is None:
        raw = resources.files("flowledger.adapters.llm").joinpath(SHIPPED_FILE).read_bytes()
        label = SHIPPED_FILE
    else:
        try:
            raw = Path(path).read_bytes()
        except OSError as error:
            raise ValidationError("pricing_file", f"cannot read {path}: {error}") from None
        label = Path(path).name
    try:
        data = json.loads(raw, parse_float=Decimal)
    except ValueError as error:
        raise ValidationError("pricing_file", f"{label} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValidationError("pricing_file", f"{label} must hold a JSON object")
    return _table(data, raw, label, default)


def _table(data: dict[str, Any], raw: bytes, label: str, default: ModelPrice | None) -> PriceTable:
    if isinstance(data.get("models"), dict):
        version = data.get("version")
        if not isinstance(version, str) or not version.strip():
            raise ValidationError("pricing_file", f"{label} needs a non-empty 'version'")
        entries: dict[str, Any] = data["models"]
        if default is None and isinstance(data.get("default"), dict):
            default = ModelPrice.from_entry(data["default"])
    else:
        # LiteLLM's file: a flat map, with a documentation entry and non-chat models.
        version = f"{label}@sha256:{hashlib.sha256(raw).hexdigest()[:12]}"
        entries = {k: v for k, v in data.items() if k != "sample_spec"}
    prices: dict[str, ModelPrice] = {}
    for model, entry in entries.items():
        if isinstance(entry, dict) and "input_cost_per_token" in entry and "output_cost_per_token" in entry:
            prices[model] = ModelPrice.from_entry(entry)
    if not prices:
        raise ValidationError("pricing_file", f"{label} has no model with input and output prices")
    return PriceTable(version=version, prices=prices, default=default)
