"""Which price is in force for a model name at a time: aliases, provider prefixes and suffixes,
and effective-dated entries (``PriceTable``); the rule that applies it is ``domain/pricing.py``.

A name resolves to one table key by trying, in order: the name itself, its alias, then the
name with provider prefixes taken off one at a time (``openrouter/deepseek/deepseek-v3.2``
→ ``deepseek/deepseek-v3.2`` → ``deepseek-v3.2``), each of those also without a routing
suffix (``:free``, ``@20250929``) and without a release date (``-20250929``,
``-2025-09-29``), checking each form and its alias. Deployment names (Azure) are aliases in
the price file.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from flowledger.domain.errors import UnknownModelPrice, ValidationError
from flowledger.domain.pricing import ModelPrice

_ROUTING_SUFFIX = re.compile(r"[:@][^/]*$")
_RELEASE_DATE = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True, kw_only=True)
class DatedPrice:
    """A model's price from ``effective_from`` (aware) until the next entry's."""

    effective_from: datetime
    price: ModelPrice

    def __post_init__(self) -> None:
        if self.effective_from.utcoffset() is None:
            raise ValidationError("effective_from", "must carry a time zone (e.g. 2025-10-01T00:00:00Z)")


def model_names(model: str) -> tuple[str, ...]:
    """The forms of ``model`` a price may be found under, most specific first (see module doc)."""
    parts = model.strip().split("/")
    names: list[str] = []
    for start in range(len(parts)):
        name = "/".join(parts[start:])
        for form in (name, _ROUTING_SUFFIX.sub("", name)):
            for candidate in (form, _RELEASE_DATE.sub("", form)):
                if candidate and candidate not in names:
                    names.append(candidate)
    return tuple(names)


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices by model name, under one version that every recorded cost cites.

    ``prices`` hold in force at any time; ``schedule`` holds models whose entries have an
    ``effective_from`` (sorted, oldest first). ``aliases`` map other names (dated releases,
    deployments) to a table key.
    """

    version: str
    prices: Mapping[str, ModelPrice]
    default: ModelPrice | None = field(default=None)
    schedule: Mapping[str, Sequence[DatedPrice]] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model, entries in self.schedule.items():
            starts = [entry.effective_from for entry in entries]
            if not starts or starts != sorted(starts) or len(set(starts)) != len(starts):
                raise ValidationError(f"prices.{model}", "needs entries in effective_from order, no two alike")
        for alias, target in self.aliases.items():
            if self._key(target) is None:
                raise ValidationError(f"aliases.{alias}", f"names {target!r}, which has no price")

    def resolve(self, model: str) -> str | None:
        """The table key whose prices ``model`` is charged at, or None."""
        for name in model_names(model):
            key = self._key(name)
            if key is None and name in self.aliases:
                key = self._key(self.aliases[name])
            if key is not None:
                return key
        return None

    def price_for(self, model: str, at: datetime | None = None) -> ModelPrice:
        """The model's price in force at ``at`` (None: its latest), else the default.

        Raises UnknownModelPrice when the name resolves to no price, or to none in force yet.
        """
        key = self.resolve(model)
        if key is not None:
            dated = self.schedule.get(key)
            if dated is None:
                return self.prices[key]
            if at is None:
                return dated[-1].price
            index = bisect_right([entry.effective_from for entry in dated], at)
            if index > 0:
                return dated[index - 1].price
        if self.default is not None:
            return self.default
        raise UnknownModelPrice(model, self.version)

    def knows(self, model: str, at: datetime | None = None) -> bool:
        """Whether ``model`` has a price at ``at`` (its own or the default)."""
        try:
            self.price_for(model, at)
        except UnknownModelPrice:
            return False
        return True

    def estimate(self, model: str, *, input_tokens: int, output_tokens: int) -> Decimal:
        """The expected cost of a call of this size, without cache or reasoning discounts."""
        return self.price_for(model).cost(input_tokens=input_tokens, output_tokens=output_tokens)

    def models(self) -> Iterator[str]:
        """Every table key, undated and dated."""
        yield from self.prices
        yield from (model for model in self.schedule if model not in self.prices)

    def _key(self, name: str) -> str | None:
        return name if name in self.prices or name in self.schedule else None
