"""Repricing recorded calls under another price table, from a time on, without touching events.

A repricing (a price table and the time it applies from) is kept in the control schema's
``repricings`` table. The cost projection prices each call with ``call_cost``: the latest
repricing that applies at the call's time and has a price for its model wins, else the cost
the event recorded. A provider's own charge (``cost_source = 'provider'``) is never repriced.
A repricing prices the tokens a call reported: a call billed for tokens its provider never
reported (``billed_unreported``) stays ``unpriced`` under any price table.
``plan`` works out, from the log, what the cost projection holds per model and day before
and after a repricing, with the same ``call_cost``: the dry run and the rebuild agree by
construction, and ``tests/integration/test_repricing.py`` checks that they do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, localcontext
from typing import Any

from psycopg import Cursor

from flowledger.domain.errors import FlowledgerError, UnknownModelPrice
from flowledger.domain.pricing import (
    EXACT,
    TOKEN_FIELDS,
    ModelPrice,
    PriceTable,
    TokenCounts,
    cost_of,
    price_table_from_document,
    retried_cost_of,
)
from flowledger.domain.values import LlmUsage
from flowledger.projections.sql import q

DDL = """
CREATE TABLE IF NOT EXISTS {s}.repricings (
    id bigserial PRIMARY KEY,
    effective_from timestamptz NOT NULL,
    version text NOT NULL,
    label text NOT NULL,
    document text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class Repricing:
    """A price table that prices the calls made at or after ``effective_from``; ``label`` is
    its file's name (a LiteLLM file's version is worked out from it)."""

    effective_from: datetime
    table: PriceTable
    label: str


@dataclass(frozen=True)
class CallCost:
    """What the cost projection records for one call."""

    cost_usd: Decimal
    retried_cost_usd: Decimal
    unpriced: bool
    price_version: str

    @property
    def charged_usd(self) -> Decimal:
        """The reply's cost and the retried attempts' together."""
        with localcontext(EXACT):  # money: the thread's context rounds (28 digits, or fewer)
            return self.cost_usd + self.retried_cost_usd


def table_of(document: str, label: str) -> PriceTable:
    """The price table a price file's text holds."""
    raw = document.encode("utf-8")
    return price_table_from_document(json.loads(raw, parse_float=Decimal), label=label, raw=raw)


def call_cost(usage: LlmUsage, at: datetime, repricings: Sequence[Repricing]) -> CallCost:
    """``usage``'s cost at the latest repricing in force at ``at`` that prices its model."""
    recorded = CallCost(usage.cost_usd, usage.retried_cost_usd, usage.unpriced, usage.price_version)
    if usage.cost_source == "provider":
        return recorded
    for repricing in reversed(repricings):
        if repricing.effective_from > at:
            continue
        price = _price(repricing.table, usage, at)
        if price is None:
            continue
        try:
            cost = cost_of(TokenCounts(**{name: getattr(usage, name) for name in TOKEN_FIELDS}), price)
            retried = _retried_cost(usage, price)
        except (FlowledgerError, TypeError):
            return recorded  # counts a repricing cannot read: keep what was recorded
        # Its model has a price now; what was not reported still has none (its counts are zeros).
        return CallCost(cost, retried, usage.unpriced and billed_unreported(usage), repricing.table.version)
    return recorded


def billed_unreported(usage: LlmUsage) -> bool:
    """Whether the call was billed for tokens its provider never reported, which no price table
    can price. ``usage.billed_unreported`` says so; a usage stored before that field says it
    only in the LLM adapter's ``extra``: ``usage_reported: false`` on the usage (its last
    attempt's tokens) or on an entry of its attempt log."""
    if usage.billed_unreported:
        return True
    extra = usage.extra
    if extra.get("usage_reported") is False:
        return True
    log = extra.get("attempt_log")
    return isinstance(log, list) and any(
        isinstance(e, dict) and e.get("usage_reported") is False for e in log
    )


def _price(table: PriceTable, usage: LlmUsage, at: datetime) -> ModelPrice | None:
    # The entry the adapter charges (``billed_key``: the model that answered when the table
    # knows it as another), then the others when that one has no price in force at ``at``.
    billed = table.billed_model(usage.request_model, usage.response_model)
    for model in (billed, usage.request_model, usage.response_model):
        if model:
            try:
                return table.price_for(model, at)
            except UnknownModelPrice:
                continue
    return None


def _counts(data: dict[str, Any]) -> dict[str, int]:
    return {name: data.get(name, 0) for name in TOKEN_FIELDS}


def _retried_cost(usage: LlmUsage, price: ModelPrice) -> Decimal:
    """The attempts before the last, repriced from the attempt log, else from the summed
    ``retried_tokens`` (a call recorded elsewhere: kept at its old price, a repricing that
    halved the prices billed its retried attempt at the old one); kept as recorded when an
    older event says neither."""
    log = usage.extra.get("attempt_log")
    billed = [e for e in log[:-1] if isinstance(e, dict) and "usage" in e] if isinstance(log, list) else []
    if not billed and usage.retried_tokens:
        return retried_cost_of(usage.retried_tokens, price, input_tokens=usage.input_tokens)
    if usage.retried_cost_usd and not billed:
        return usage.retried_cost_usd
    with localcontext(EXACT):
        return sum((cost_of(TokenCounts(**_counts(e["usage"])), price) for e in billed), Decimal(0))


class RepricingCache:
    """The recorded repricings, parsed once: a batch asks only whether a new one was added."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, list[Repricing]]] = {}

    def load(self, cur: Cursor[Any], control: str) -> list[Repricing]:
        """Every repricing recorded under ``control``, oldest first (none if there is no table)."""
        cur.execute("SELECT to_regclass(%s)", [f'"{control}".repricings'])
        row = cur.fetchone()
        if row is None or row[0] is None:
            return []
        cur.execute(q("SELECT coalesce(max(id), 0) FROM {s}.repricings", control))
        last = int(cur.fetchone()[0])  # type: ignore[index]
        seen = self._seen.get(control)
        if seen is not None and seen[0] == last:
            return seen[1]
        cur.execute(q("SELECT effective_from, label, document FROM {s}.repricings ORDER BY id", control))
        loaded = [
            Repricing(start, table_of(document, label), label) for start, label, document in cur.fetchall()
        ]
        self._seen[control] = (last, loaded)
        return loaded


def record_repricing(cur: Cursor[Any], control: str, repricing: Repricing, document: str) -> None:
    """Keep ``repricing`` (its table as the price file's text) for every later build."""
    cur.execute(q(DDL, control))
    cur.execute(
        q(
            "INSERT INTO {s}.repricings (effective_from, version, label, document) VALUES (%s, %s, %s, %s)",
            control,
        ),
        [repricing.effective_from, repricing.table.version, repricing.label, document],
    )


@dataclass
class Change:
    """One model's calls on one day (UTC): their cost before and after a repricing; ``model``
    None for calls whose usage named no model."""

    model: str | None
    day: date
    calls: int = 0
    unpriced_before: int = 0
    unpriced_after: int = 0
    before_usd: Decimal = Decimal(0)
    after_usd: Decimal = Decimal(0)

    @property
    def change_usd(self) -> Decimal:
        """After minus before (negative is a saving)."""
        with localcontext(EXACT):
            return self.after_usd - self.before_usd


def changes(
    calls: Iterator[tuple[str | None, datetime, LlmUsage]], before: Sequence[Repricing], added: Repricing
) -> list[Change]:
    """Per model and day, the calls made at or after ``added.effective_from`` priced with the
    repricings ``before``, and with ``added`` too (``calls``: model, time, usage)."""
    after = [*before, added]
    rows: dict[tuple[str | None, date], Change] = {}
    for model, at, usage in calls:
        if at < added.effective_from:
            continue
        day = at.astimezone(UTC).date()
        row = rows.setdefault((model, day), Change(model, day))
        old, new = call_cost(usage, at, before), call_cost(usage, at, after)
        row.calls += 1
        row.unpriced_before += old.unpriced
        row.unpriced_after += new.unpriced
        with localcontext(EXACT):  # the dry run must show what the applied projection sums
            row.before_usd += old.charged_usd
            row.after_usd += new.charged_usd
    return sorted(rows.values(), key=lambda c: (c.day, c.model is not None, c.model or ""))
