"""Cost dashboard queries over ``llm_calls``: totals, errors and exact latency percentiles by
any grouping and time window, and repricing recorded usage under other prices."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.errors import ValidationError

GROUPINGS: Mapping[str, str] = {
    "model": "coalesce(model, '(none)')",
    "provider": "coalesce(provider, '(none)')",
    "workflow": "workflow",
    "step": "step",
    "source": "source",
    "minute": "date_trunc('minute', occurred_at, 'UTC')",
    "hour": "date_trunc('hour', occurred_at, 'UTC')",
    "day": "date_trunc('day', occurred_at, 'UTC')",
}
"""What a dashboard can be grouped by (time buckets are UTC)."""


@dataclass(frozen=True)
class DashboardRow:
    """Calls, errors, tokens, cost and latency of one group."""

    group: tuple[Any, ...]
    calls: int
    errors: int
    errors_by_type: dict[str, int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal
    latency_avg_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None


@dataclass(frozen=True)
class Price:
    """USD per token of each type; cached input and reasoning output fall back to their base.

    ``input_tokens`` include the cached ones and ``output_tokens`` the reasoning ones, so
    each is split before pricing (the same rule the LLM adapter's price table applies).
    """

    input_per_token: Decimal
    output_per_token: Decimal
    cached_input_per_token: Decimal | None = None
    reasoning_output_per_token: Decimal | None = None


@dataclass(frozen=True)
class RepriceRow:
    """Recorded cost of a group beside what the same usage costs under the given prices."""

    group: tuple[Any, ...]
    calls: int
    priced_calls: int
    recorded_cost_usd: Decimal
    repriced_cost_usd: Decimal

    @property
    def difference_usd(self) -> Decimal:
        """Repriced minus recorded, over the calls that had a price (negative is a saving)."""
        return self.repriced_cost_usd - self.recorded_cost_usd


def _groups(by: Sequence[str]) -> list[sql.Composable]:
    unknown = [key for key in by if key not in GROUPINGS]
    if unknown:
        raise ValidationError("by", f"cannot group by {unknown}; choose from {sorted(GROUPINGS)}")
    if not by:
        return [sql.SQL("'all'::text AS g0")]
    return [sql.SQL(f"{GROUPINGS[key]} AS g{i}") for i, key in enumerate(by)]  # type: ignore[arg-type]


def _keys(count: int) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(f"g{i}") for i in range(max(count, 1)))


def dashboard(
    conn: Connection[Any],
    reader: str,
    *,
    since: datetime,
    until: datetime | None = None,
    by: Sequence[str] = ("model",),
) -> list[DashboardRow]:
    """Per group of calls with ``since <= occurred_at < until``: the dashboard numbers, costliest first."""
    keys = _keys(len(by))
    statement = sql.SQL("""
        WITH calls AS (
            SELECT {groups}, error_type, input_tokens, output_tokens, cache_read_input_tokens,
                   reasoning_output_tokens, cost_usd, latency_ms
            FROM {reader}.llm_calls
            WHERE occurred_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR occurred_at < %(until)s)
        ), errors AS (
            SELECT {keys}, jsonb_object_agg(error_type, n) AS by_type
            FROM (SELECT {keys}, error_type, count(*) AS n FROM calls
                  WHERE error_type IS NOT NULL GROUP BY {keys}, error_type) AS e
            GROUP BY {keys}
        )
        SELECT {keys}, count(*), count(error_type), sum(input_tokens), sum(output_tokens),
               sum(cache_read_input_tokens), sum(reasoning_output_tokens), sum(cost_usd),
               avg(latency_ms),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms),
               min(errors.by_type::text)
        FROM calls LEFT JOIN errors USING ({keys})
        GROUP BY {keys}
        ORDER BY sum(cost_usd) DESC, {keys}
    """).format(groups=sql.SQL(", ").join(_groups(by)), reader=sql.Identifier(reader), keys=keys)
    rows = conn.execute(statement, {"since": since, "until": until}).fetchall()
    width = max(len(by), 1)
    result = []
    for row in rows:
        n = row[width:]
        result.append(
            DashboardRow(
                group=tuple(row[:width]),
                calls=n[0],
                errors=n[1],
                errors_by_type=_json_counts(n[11]),
                input_tokens=int(n[2]),
                output_tokens=int(n[3]),
                cached_tokens=int(n[4]),
                reasoning_tokens=int(n[5]),
                cost_usd=n[6],
                latency_avg_ms=n[7],
                latency_p50_ms=n[8],
                latency_p95_ms=n[9],
                latency_p99_ms=n[10],
            )
        )
    return result


def _json_counts(text: str | None) -> dict[str, int]:
    return {} if text is None else {k: int(v) for k, v in json.loads(text).items()}


def reprice(
    conn: Connection[Any],
    reader: str,
    prices: Mapping[str, Price],
    *,
    as_model: str | None = None,
    since: datetime,
    until: datetime | None = None,
    by: Sequence[str] = ("model",),
) -> list[RepriceRow]:
    """What the recorded usage would have cost: each call at its own model's price in ``prices``,
    or every call at ``as_model``'s price. Calls without a price are counted but not priced.
    """
    if as_model is not None and as_model not in prices:
        raise KeyError(f"no price for {as_model!r}")
    models = list(prices)
    statement = sql.SQL("""
        WITH prices AS (
            SELECT * FROM unnest(%(models)s::text[], %(input)s::numeric[], %(cached)s::numeric[],
                                 %(output)s::numeric[], %(reasoning)s::numeric[])
                          AS p(price_model, input, cached, output, reasoning)
        ), calls AS (
            SELECT {groups}, c.*, p.price_model AS priced_as,
                   (c.input_tokens - c.cache_read_input_tokens) * p.input
                   + c.cache_read_input_tokens * coalesce(p.cached, p.input)
                   + (c.output_tokens - c.reasoning_output_tokens) * p.output
                   + c.reasoning_output_tokens * coalesce(p.reasoning, p.output) AS repriced
            FROM {reader}.llm_calls AS c
            LEFT JOIN LATERAL (
                -- The asked-for model first (providers answer with dated names), then
                -- the answering one, each also without a ``provider/`` prefix.
                SELECT * FROM prices
                WHERE price_model IN (%(as_model)s::text, c.request_model, c.model,
                                      regexp_replace(c.request_model, '^.*/', ''),
                                      regexp_replace(c.model, '^.*/', ''))
                ORDER BY price_model = %(as_model)s::text DESC NULLS LAST,
                         price_model = c.request_model DESC NULLS LAST,
                         price_model = regexp_replace(c.request_model, '^.*/', '') DESC NULLS LAST,
                         price_model = c.model DESC NULLS LAST
                LIMIT 1
            ) AS p ON true
            WHERE occurred_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR occurred_at < %(until)s)
        )
        SELECT {keys}, count(*), count(priced_as),
               coalesce(sum(cost_usd) FILTER (WHERE priced_as IS NOT NULL), 0),
               coalesce(sum(repriced), 0)
        FROM calls GROUP BY {keys} ORDER BY {keys}
    """).format(groups=sql.SQL(", ").join(_groups(by)), reader=sql.Identifier(reader), keys=_keys(len(by)))
    params = {
        "models": models,
        "input": [prices[m].input_per_token for m in models],
        "cached": [prices[m].cached_input_per_token for m in models],
        "output": [prices[m].output_per_token for m in models],
        "reasoning": [prices[m].reasoning_output_per_token for m in models],
        "as_model": as_model,
        "since": since,
        "until": until,
    }
    width = max(len(by), 1)
    return [
        RepriceRow(tuple(r[:width]), r[width], r[width + 1], r[width + 2], r[width + 3])
        for r in conn.execute(statement, params).fetchall()
    ]
