"""Which price is in force for a model name at a time: aliases, provider prefixes and suffixes,
and effective-dated entries (``PriceTable``); the rule that applies it is ``domain/pricing.py``.

A name resolves to one table key by trying, in order: the name itself, its alias, then the
name with provider prefixes taken off one at a time (``openrouter/deepseek/deepseek-v3.2``
→ ``deepseek/deepseek-v3.2`` → ``deepseek-v3.2``), each of those also without a routing
suffix (``:free``, ``@20250929``) and without a release date (``-20250929``,
``-2025-09-29``), checking each form and its alias. Deployment names (Azure) are aliases in
the price file.

A ``:free`` variant (OpenRouter's ``meta-llama/llama-3.3-70b-instruct:free``) is another
offer of its model, at no charge: unless the table names that variant (as a model or an
alias), it resolves to the key ``<its model's key>:free`` and is priced $0 (``FREE``), never
at the paid model's price nor the table's default.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from flowledger.domain.bounds import require_name, require_no_controls, require_text
from flowledger.domain.errors import UnknownModelPrice, ValidationError
from flowledger.domain.price_rule import TOKEN_FIELDS, ModelPrice, retried_cost_of
from flowledger.domain.values import USAGE_TEXT_LIMITS, LlmUsage

_ROUTING_SUFFIX = re.compile(r"[:@][^/]*$")
_RELEASE_DATE = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")
FREE_SUFFIX = ":free"
"""OpenRouter's routing suffix for a model's no-charge variant."""
FREE = ModelPrice(input_cost_per_token=Decimal(0), output_cost_per_token=Decimal(0))
"""The price of a ``:free`` variant the table does not name."""


def is_free_variant(model: str) -> bool:
    """Whether ``model`` names a ``:free`` variant (its last path segment's routing suffix)."""
    found = _ROUTING_SUFFIX.search(model.strip())
    return found is not None and found.group() == FREE_SUFFIX


@dataclass(frozen=True, kw_only=True)
class DatedPrice:
    """A model's price from ``effective_from`` (aware) until the next entry's."""

    effective_from: datetime
    price: ModelPrice

    def __post_init__(self) -> None:
        if self.effective_from.utcoffset() is None:
            raise ValidationError("effective_from", "must carry a time zone (e.g. 2025-10-01T00:00:00Z)")
        try:
            self.effective_from.astimezone(UTC)
        except OverflowError:  # prices show, a what-if and repricing all read it in UTC (exit 70)
            raise ValidationError(
                "effective_from",
                f"must lie within the years 1 to 9999 in UTC, got {self.effective_from.isoformat()}",
            ) from None


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


def billed_key(resolve: Callable[[str], str | None], asked: str | None, answered: str | None) -> str | None:
    """The price entry a call is charged at, of the model ``asked`` for and the one that
    ``answered`` (the reply's ``model``), each found by ``resolve``: the one that answered when
    it is known as another model (a router such as ``openrouter/auto``, or a provider's
    fallback, bills the model it ran), else the one asked for (a provider answers with a dated
    name of it), else the one that answered; None when neither is known. The one rule for the
    LLM adapter, ``reprice`` and the dashboard's what-if."""
    asked_key = resolve(asked) if asked else None
    answered_key = resolve(answered) if answered else None
    # A free variant answered under its model's paid name ran that variant: nothing else billed.
    same = asked_key is not None and asked_key in (answered_key, f"{answered_key}{FREE_SUFFIX}")
    if answered_key is not None and not same:
        return answered_key
    return asked_key


MAX_PRICE_VERSION = dict(USAGE_TEXT_LIMITS)["price_version"]
"""The longest version a table may have: the most a recorded usage's ``price_version`` holds."""


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
        # Every priced call cites the version (``LlmUsage.price_version``), which a recorded
        # step holds to 1,000 characters: a price file's version of 5,000 was taken, and every
        # model call it priced was then paid for and failed as "the model's reply cannot be
        # recorded: usage.price_version: must be at most 1000 characters".
        require_text("version", self.version, max_length=MAX_PRICE_VERSION)
        require_no_controls("version", self.version)
        # A price that is no ModelPrice (prices=5, {"m": 5}, default=5) was taken, and every
        # call it priced then failed with a bare AttributeError or TypeError.
        if not isinstance(self.prices, Mapping) or not all(
            isinstance(model, str) and isinstance(price, ModelPrice) for model, price in self.prices.items()
        ):
            raise ValidationError("prices", "must map model names to ModelPrice")
        if self.default is not None and not isinstance(self.default, ModelPrice):
            raise ValidationError(
                "default", f"must be a ModelPrice or None, got {type(self.default).__name__}"
            )
        for model, entries in self.schedule.items():
            starts = [entry.effective_from for entry in entries]
            if not starts or starts != sorted(starts) or len(set(starts)) != len(starts):
                raise ValidationError(
                    f"prices.{model}", "needs entries in effective_from order, no two alike"
                )
        for alias, target in self.aliases.items():
            if self._key(target) is None:
                raise ValidationError(f"aliases.{alias}", f"names {target!r}, which has no price")

    def in_force(self, at: datetime) -> dict[str, ModelPrice]:
        """Each model's price in force at ``at``: a what-if prices with what a call would be
        charged then, never an entry that takes effect later (``prices`` holds a scheduled
        model's newest entry, which may lie ahead). A model with no entry in force yet is left
        out."""
        return {model: self.price_for(model, at) for model in self.models() if self.knows(model, at)}

    def key_in_force(self, model: str, at: datetime) -> str | None:
        """The table key ``model`` is priced as (``resolve``: alias, provider prefix, release date)
        when that key has an entry in force at ``at`` (``in_force``), else None: a what-if's
        model named as calls name it (``openai/gpt-4.1``, ``gpt-4.1-2025-04-14``) was said to
        have no price, though every call by that name is priced."""
        key = self.resolve(model)
        return key if key is not None and key in self.in_force(at) else None

    def billed_model(self, asked: str | None, answered: str | None) -> str | None:
        """The table key a call asking for ``asked`` and answered by ``answered`` is priced by
        (``billed_key``), or None."""
        return billed_key(self.resolve, asked, answered)

    def resolve(self, model: str) -> str | None:
        """The table key whose prices ``model`` is charged at, or None; for a ``:free`` variant
        the table does not name, ``<its model's key>:free`` (priced ``FREE``: module doc)."""
        names = model_names(model)
        if not is_free_variant(model):
            return self._first_key(names)
        named = self._first_key(name for name in names if is_free_variant(name))
        if named is not None:
            return named
        # Resolved as its model alone, a :free call was charged the paid price.
        paid = self._first_key(names)
        return f"{paid}{FREE_SUFFIX}" if paid is not None else model.strip()

    def _first_key(self, names: Iterable[str]) -> str | None:
        """The table key of the first of ``names`` that is one, or whose alias names one."""
        for name in names:
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
        if key is not None and self._key(key) is None:
            return FREE  # a :free variant the table does not name
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

    def price_usage(self, usage: LlmUsage, at: datetime) -> LlmUsage | None:
        """``usage`` (a call recorded elsewhere that states no cost) with its tokens priced at the
        entry in force at ``at`` for the model it is billed as (``billed_model``; the default for
        a name the table lacks), citing this table's version unless it cites one; None when no
        price is known for it. Its ``retried_tokens`` are priced too, into ``retried_cost_usd``
        unless that was stated (left at $0, a REST step retried once showed half what it was
        billed); counts the rule cannot read leave the call ``unpriced``."""
        asked, answered = usage.request_model or None, usage.response_model or None
        name = self.billed_model(asked, answered) or asked or answered
        if name is None:
            return None
        try:
            price = self.price_for(name, at)
        except UnknownModelPrice:
            return None
        cost = price.cost(**{token: getattr(usage, token) for token in TOKEN_FIELDS})
        priced = replace(usage, cost_usd=cost, price_version=usage.price_version or self.version)
        if not usage.retried_tokens or usage.retried_cost_usd:
            return priced
        try:
            retried = retried_cost_of(usage.retried_tokens, price, input_tokens=usage.input_tokens)
        except ValidationError:
            return replace(priced, unpriced=True)
        return replace(priced, retried_cost_usd=retried)

    def estimate(self, model: str, *, input_tokens: int, output_tokens: int) -> Decimal:
        """The expected cost of a call of this size, without cache or reasoning discounts."""
        return self.price_for(model).cost(input_tokens=input_tokens, output_tokens=output_tokens)

    def latest(self) -> dict[str, ModelPrice]:
        """Every table key's price in force last (a dated model's newest entry)."""
        return {**self.prices, **{model: dated[-1].price for model, dated in self.schedule.items()}}

    def models(self) -> Iterator[str]:
        """Every table key, undated and dated."""
        yield from self.prices
        yield from (model for model in self.schedule if model not in self.prices)

    def _key(self, name: str) -> str | None:
        return name if name in self.prices or name in self.schedule else None


def price_table_from_document(
    data: dict[str, Any], *, label: str, raw: bytes, default: ModelPrice | None = None
) -> PriceTable:
    """The table a price file holds (``data`` is its JSON, numbers read as Decimal; ``raw`` its
    bytes, which name the version of a LiteLLM file); ``default`` prices models it lacks."""
    aliases: dict[str, str] = {}
    own_format = isinstance(data.get("models"), dict)
    if own_format:
        version = data.get("version")
        if not isinstance(version, str) or not version.strip():
            raise ValidationError("pricing_file", f"{label} needs a non-empty 'version'")
        entries: dict[str, Any] = data["models"]
        _require_units(data, label)
        if default is None and isinstance(data.get("default"), dict):
            try:
                default = ModelPrice.from_entry(data["default"])
            except ValidationError as error:
                raise _in_file(label, "default", error) from None
        raw_aliases = data.get("aliases", {})
        if not isinstance(raw_aliases, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw_aliases.items()
        ):
            raise ValidationError("pricing_file", f"{label}: 'aliases' must map names to model names")
        for alias, target in raw_aliases.items():
            try:
                require_name("alias", alias)
                require_name("model", target)
            except ValidationError as error:
                said = f"{label}: aliases: {error.field} {error.message}"
                raise ValidationError("pricing_file", said) from None
        aliases = dict(raw_aliases)
    else:
        # LiteLLM's file: a flat map, with a documentation entry and non-chat models.
        version = f"{label}@sha256:{hashlib.sha256(raw).hexdigest()[:12]}"
        entries = {k: v for k, v in data.items() if k != "sample_spec"}
    prices: dict[str, ModelPrice] = {}
    schedule: dict[str, list[DatedPrice]] = {}
    for model, entry in entries.items():
        try:
            if own_format or isinstance(entry, list) or _is_price(entry):
                # A model the table prices is a model name as every command takes one: an empty,
                # blank or control-character key (a NUL, an escape) was taken and shown as such.
                require_name("model", model)
            if isinstance(entry, list):
                schedule[model] = sorted(
                    (_dated(item) for item in entry), key=lambda dated: dated.effective_from
                )
                starts = {dated.effective_from for dated in schedule[model]}
                if not entry or len(starts) != len(entry):
                    # Said by the table ("prices.m: ..."), without the file's name.
                    raise ValidationError("price", "needs dated entries, no two in force from the same time")
            elif _is_price(entry) and "effective_from" in entry:
                schedule[model] = [_dated(entry)]
            elif _is_price(entry) or own_format:
                # Our own format lists prices only: an entry without both was left out without a
                # word, and its model then had no price. LiteLLM's lists models priced otherwise.
                prices[model] = ModelPrice.from_entry(entry if isinstance(entry, dict) else {})
        except ValidationError as error:
            raise _in_file(label, model, error) from None
    if not prices and not schedule:
        raise ValidationError("pricing_file", f"{label} has no model with input and output prices")
    try:
        return PriceTable(version=version, prices=prices, default=default, schedule=schedule, aliases=aliases)
    except ValidationError as error:  # an alias naming no price: said without the file's name
        raise ValidationError("pricing_file", f"{label}: {error.field}: {error.message}") from None


_UNITS = {"currency": "USD", "unit": "per token"}
"""What the table's own format may say its amounts are (the shipped file says both): nothing else
is read, so a file saying ``"currency": "EUR"`` or ``"unit": "per million tokens"`` was taken and
its figures charged as USD per token, a per-million price a million times over."""


def _require_units(data: dict[str, Any], label: str) -> None:
    """Refuse a file of the table's own format that says its amounts are other than ``_UNITS``."""
    for key, meant in _UNITS.items():
        said = data.get(key, meant)
        if said != meant:
            raise ValidationError(
                "pricing_file",
                f"{label}: {key} {str(said)[:40]!r} is not read: prices are USD per token ({key} {meant!r})",
            )


def _in_file(label: str, model: str, error: ValidationError) -> ValidationError:
    """An entry's error naming the file and the model: its own named neither
    ("price: needs input_cost_per_token and output_cost_per_token")."""
    what = error.field.removeprefix("price").removeprefix(".")
    return ValidationError(
        "pricing_file", f"{label}, model {model!r}: {what + ' ' if what else ''}{error.message}"
    )


def _is_price(entry: Any) -> bool:
    return isinstance(entry, dict) and "input_cost_per_token" in entry and "output_cost_per_token" in entry


def _dated(entry: Any) -> DatedPrice:
    if not _is_price(entry) or not isinstance(entry.get("effective_from"), str):
        raise ValidationError("price", "each dated entry needs effective_from, input and output prices")
    try:
        start = datetime.fromisoformat(entry["effective_from"])
    except ValueError:
        raise ValidationError(
            "price.effective_from", f"not an ISO 8601 time: {entry['effective_from']!r}"
        ) from None
    return DatedPrice(effective_from=start, price=ModelPrice.from_entry(entry))
