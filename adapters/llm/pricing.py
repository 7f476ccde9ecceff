"""Loading price tables (LiteLLM's key format); the pricing rule itself is the domain's.

``ModelPrice`` and ``PriceTable`` live in ``flowledger.domain.pricing`` (with ``cost_of``)
and are re-exported here for callers that import them from the adapter.

The shipped table (``prices.json``) has a ``version``, its ``sources`` and a ``models``
map; ``FLOWLEDGER_PRICING_FILE`` may point at one like it or at LiteLLM's own
``model_prices_and_context_window.json`` (a flat map of model to entry; its version
is then the file's name and content hash). A table may carry a ``default`` entry;
without one an unknown model raises UnknownModelPrice rather than costing $0.

A model's entry may be a list of entries, each with an ``effective_from`` (ISO 8601 with a
zone): a call is priced by the entry in force at its time. ``aliases`` maps other names
(dated releases, Azure deployments) to a model of the table.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from flowledger.domain.errors import ValidationError
from flowledger.domain.price_table import DatedPrice, PriceTable
from flowledger.domain.pricing import ModelPrice

SHIPPED_FILE = "prices.json"

__all__ = ["SHIPPED_FILE", "DatedPrice", "ModelPrice", "PriceTable", "load_price_table"]


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
    aliases: dict[str, str] = {}
    if isinstance(data.get("models"), dict):
        version = data.get("version")
        if not isinstance(version, str) or not version.strip():
            raise ValidationError("pricing_file", f"{label} needs a non-empty 'version'")
        entries: dict[str, Any] = data["models"]
        if default is None and isinstance(data.get("default"), dict):
            default = ModelPrice.from_entry(data["default"])
        raw_aliases = data.get("aliases", {})
        if not isinstance(raw_aliases, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw_aliases.items()
        ):
            raise ValidationError("pricing_file", f"{label}: 'aliases' must map names to model names")
        aliases = dict(raw_aliases)
    else:
        # LiteLLM's file: a flat map, with a documentation entry and non-chat models.
        version = f"{label}@sha256:{hashlib.sha256(raw).hexdigest()[:12]}"
        entries = {k: v for k, v in data.items() if k != "sample_spec"}
    prices: dict[str, ModelPrice] = {}
    schedule: dict[str, list[DatedPrice]] = {}
    for model, entry in entries.items():
        if isinstance(entry, list):
            schedule[model] = sorted(
                (_dated(model, item) for item in entry), key=lambda dated: dated.effective_from
            )
        elif _is_price(entry) and "effective_from" in entry:
            schedule[model] = [_dated(model, entry)]
        elif _is_price(entry):
            prices[model] = ModelPrice.from_entry(entry)
    if not prices and not schedule:
        raise ValidationError("pricing_file", f"{label} has no model with input and output prices")
    return PriceTable(version=version, prices=prices, default=default, schedule=schedule, aliases=aliases)


def _is_price(entry: Any) -> bool:
    return isinstance(entry, dict) and "input_cost_per_token" in entry and "output_cost_per_token" in entry


def _dated(model: str, entry: Any) -> DatedPrice:
    if not _is_price(entry) or not isinstance(entry.get("effective_from"), str):
        raise ValidationError(
            f"prices.{model}", "each dated entry needs effective_from, input and output prices"
        )
    try:
        start = datetime.fromisoformat(entry["effective_from"])
    except ValueError:
        raise ValidationError(
            f"prices.{model}.effective_from", f"not an ISO 8601 time: {entry['effective_from']!r}"
        ) from None
    return DatedPrice(effective_from=start, price=ModelPrice.from_entry(entry))
