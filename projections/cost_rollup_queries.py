"""The cost dashboard read from ``cost_rollups``: the window is cut into whole days, hours and
minutes (``windows.cover``) with raw ``llm_calls`` rows for the seconds at its edges, so sums
and counts equal the raw query's exactly and percentiles are within ``RELATIVE_ERROR``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.pricing import EXACT, TOKEN_FIELDS
from flowledger.projections.cost_queries import GROUPINGS, DashboardRow, costliest_first, group_of
from flowledger.projections.cost_rollups import MEASURES, SUMS
from flowledger.projections.latency_sketch import bucket_sql, percentiles
from flowledger.projections.windows import GRAINS, Piece, cover

QUANTILES = (0.5, 0.95, 0.99)

_QUERY = """
WITH parts AS (
    SELECT {rolled}, error_type, calls, {sums}, latency_calls, latency_sum_ms, latency_buckets, latency_counts
    FROM {r}.cost_rollups WHERE tenant = %(tenant)s AND ({rolled_where})
    UNION ALL
    SELECT {raw}, error_type, 1, {raw_sums}, (latency_ms IS NOT NULL)::integer,
           coalesce(latency_ms::numeric, 0),
           CASE WHEN latency_ms IS NULL THEN '{{}}'::integer[] ELSE ARRAY[{bucket}] END,
           CASE WHEN latency_ms IS NULL THEN '{{}}'::bigint[] ELSE ARRAY[1::bigint] END
    FROM {r}.llm_calls WHERE tenant = %(tenant)s AND ({raw_where})
)
SELECT {keys}, error_type, sum(calls), {summed}, sum(latency_calls), sum(latency_sum_ms),
       NULL::integer, NULL::bigint
FROM parts GROUP BY {keys}, error_type
UNION ALL
SELECT {keys}, NULL, NULL, {nulls}, NULL, NULL, h.b, sum(h.n)
FROM parts, unnest(latency_buckets, latency_counts) AS h(b, n) GROUP BY {keys}, h.b
"""


def coarsest_grain(by: Sequence[str]) -> str:
    """The coarsest roll-up grain that still separates the time groups asked for."""
    wanted = [GRAINS.index(key) for key in by if key in GRAINS]
    return GRAINS[min(wanted, default=len(GRAINS) - 1)]


def rollup_dashboard(
    conn: Connection[Any],
    reader: str,
    *,
    tenant: str,
    since: datetime,
    until: datetime | None,
    by: Sequence[str],
) -> list[DashboardRow]:
    """``cost_queries.dashboard``'s rows, read from the roll-ups (see the module docstring)."""
    pieces = cover(since, until, coarsest_grain(by))
    rolled = [p for p in pieces if p.grain is not None]
    raw = [p for p in pieces if p.grain is None]
    width = max(len(by), 1)
    statement = sql.SQL(_QUERY).format(
        rolled_where=ranges(rolled, "at"),
        raw_where=ranges(raw, "occurred_at"),
        rolled=_groups(by, "at"),
        raw=_groups(by, "occurred_at"),
        sums=sql.SQL(", ".join(SUMS)),
        raw_sums=sql.SQL(", ".join(f"{expr} AS {name}" for name, expr, _ in MEASURES)),
        summed=sql.SQL(", ".join(f"sum({c})" for c in SUMS)),
        nulls=sql.SQL(", ".join("NULL" for _ in SUMS)),
        bucket=sql.SQL(bucket_sql("latency_ms")),  # type: ignore[arg-type]
        r=sql.Identifier(reader),
        keys=sql.SQL(", ").join(sql.Identifier(f"g{i}") for i in range(width)),
    )
    params = {"tenant": tenant}
    totals: dict[tuple[Any, ...], dict[str, Any]] = {}
    histograms: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for row in conn.execute(statement, params):
        group, (error_type, calls, *rest) = group_of(row[:width], by), row[width:]
        *sums, latency_calls, latency_sum, bucket, count = rest
        if calls is None:
            histograms.setdefault(group, []).append((bucket, int(count)))
            continue
        total = totals.setdefault(group, _empty())
        total["calls"] += int(calls)
        side = "failed" if error_type is not None else "succeeded"
        if error_type is not None:
            total["errors_by_type"][error_type] = int(calls)
        with localcontext(EXACT):  # money: the thread's context rounds (28 digits, or fewer)
            total[side] = [a + b for a, b in zip(total[side], sums, strict=True)]
            total["latency_sum"] += latency_sum
        total["latency_calls"] += int(latency_calls)
    result = [_row(group, total, histograms.get(group, [])) for group, total in totals.items()]
    return costliest_first(result)


def ranges(pieces: Sequence[Piece], column: str, *, table: str | None = None) -> sql.Composable:
    """A condition matching the pieces' time ranges, as constants, so the planner scans only
    those ranges of the ``(…, grain, at)`` index (a join on arrays of them was read as a
    whole-table scan); ``grain`` is matched too for roll-up pieces."""
    if not pieces:
        return sql.SQL("false")
    name = sql.Identifier(column) if table is None else sql.Identifier(table, column)
    grain = sql.Identifier("grain") if table is None else sql.Identifier(table, "grain")
    conditions = []
    for piece in pieces:
        parts = [sql.SQL("{} >= {}").format(name, sql.Literal(piece.start))]
        if piece.end is not None:
            parts.append(sql.SQL("{} < {}").format(name, sql.Literal(piece.end)))
        if piece.grain is not None:
            parts.insert(0, sql.SQL("{} = {}").format(grain, sql.Literal(piece.grain)))
        conditions.append(sql.SQL("(") + sql.SQL(" AND ").join(parts) + sql.SQL(")"))
    return sql.SQL(" OR ").join(conditions)


def _groups(by: Sequence[str], time_column: str) -> sql.Composable:
    if not by:
        return sql.SQL("'all'::text AS g0")
    return sql.SQL(", ").join(
        sql.SQL(f"{GROUPINGS[key].replace('occurred_at', time_column)} AS g{i}")  # type: ignore[arg-type]
        for i, key in enumerate(by)
    )


def _empty() -> dict[str, Any]:
    return {
        "calls": 0,
        "errors_by_type": {},
        "succeeded": [Decimal(0)] * len(SUMS),
        "failed": [Decimal(0)] * len(SUMS),
        "latency_calls": 0,
        "latency_sum": Decimal(0),
    }


def _row(group: tuple[Any, ...], total: dict[str, Any], histogram: list[tuple[int, int]]) -> DashboardRow:
    ok = dict(zip(SUMS, total["succeeded"], strict=True))
    failed = dict(zip(SUMS, total["failed"], strict=True))
    with localcontext(EXACT):  # not the latency average below: a quotient needs a precision
        sums = {name: ok[name] + failed[name] for name in SUMS}
        for name in TOKEN_FIELDS:  # every attempt billed, as the raw read gives them
            sums[name] += sums.pop(f"retried_{name}")
        cost_usd = sums["cost_usd"] + sums["retried_cost_usd"]
        failed_cost_usd = failed["cost_usd"] + failed["retried_cost_usd"]
    p50, p95, p99 = percentiles(histogram, QUANTILES)
    n = total["latency_calls"]
    return DashboardRow(
        group=group,
        calls=total["calls"],
        errors=sum(total["errors_by_type"].values()),
        errors_by_type=total["errors_by_type"],
        input_tokens=int(sums["input_tokens"]),
        output_tokens=int(sums["output_tokens"]),
        cached_tokens=int(sums["cache_read_input_tokens"]),
        reasoning_tokens=int(sums["reasoning_output_tokens"]),
        cost_usd=cost_usd,
        latency_avg_ms=float(total["latency_sum"] / n) if n else None,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        succeeded_cost_usd=ok["cost_usd"],
        retried_cost_usd=ok["retried_cost_usd"],
        failed_cost_usd=failed_cost_usd,
        unpriced_calls=int(sums["unpriced_calls"]),
        cache_creation_tokens=int(sums["cache_creation_input_tokens"]),
        audio_input_tokens=int(sums["audio_input_tokens"]),
        audio_output_tokens=int(sums["audio_output_tokens"]),
    )
