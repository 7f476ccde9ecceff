"""Loading price files (LiteLLM's key format); their format and the pricing rule are the domain's.

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

import json
from decimal import Decimal
from importlib import resources
from os import PathLike
from pathlib import Path

from flowledger.domain.bounds import json_problem
from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import DatedPrice, ModelPrice, PriceTable, price_table_from_document

SHIPPED_FILE = "prices.json"

__all__ = ["SHIPPED_FILE", "DatedPrice", "ModelPrice", "PriceTable", "load_price_table", "read_price_file"]


MAX_PRICE_FILE_BYTES = 16 * 1024 * 1024
"""The largest price file read (the shipped one is a few KB): a larger one, or a file that
never ends (``/dev/zero``), is refused after that many bytes."""


def load_price_table(path: Path | None = None, *, default: ModelPrice | None = None) -> PriceTable:
    """The table in ``path``, or the shipped one; ``default`` prices models the file lacks."""
    return read_price_file(path, default=default)[0]


def read_price_file(path: Path | None = None, *, default: ModelPrice | None = None) -> tuple[PriceTable, str]:
    """The table in ``path`` (or the shipped one) and the file's text, which a repricing keeps."""
    if path is not None and not isinstance(path, str | PathLike):  # (5 was a bare TypeError)
        raise ValidationError("pricing_file", f"must be a path, got {type(path).__name__}")
    if path is None:
        raw = resources.files("flowledger.adapters.llm").joinpath(SHIPPED_FILE).read_bytes()
        label = SHIPPED_FILE
    else:
        try:
            with Path(path).open("rb") as file:
                raw = file.read(MAX_PRICE_FILE_BYTES + 1)
        except OSError as error:
            raise ValidationError("pricing_file", f"cannot read {path}: {error}") from None
        label = Path(path).name
        if len(raw) > MAX_PRICE_FILE_BYTES:
            raise ValidationError("pricing_file", f"{label} is larger than {MAX_PRICE_FILE_BYTES:,} bytes")
    # Text first: json.loads of bytes would guess UTF-16 or -32 and call the file "not JSON".
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValidationError(
            "pricing_file", f"{label} is not UTF-8 text: byte {error.start} ({error.reason})"
        ) from None
    try:
        data = json.loads(text, parse_float=Decimal)
    except (ValueError, RecursionError) as error:
        raise ValidationError("pricing_file", f"{label} is not JSON: {json_problem(error)}") from None
    if not isinstance(data, dict):
        raise ValidationError("pricing_file", f"{label} must hold a JSON object")
    return price_table_from_document(data, label=label, raw=raw, default=default), text
