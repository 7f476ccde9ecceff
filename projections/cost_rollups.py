"""Roll-ups of ``llm_calls``: per minute, hour and day (UTC), and per tenant, workflow, step,
source, model, provider and error type, the calls, token and cost sums, and a latency
histogram (``latency_sketch``), so long-window dashboards read thousands of rows, not millions.

One function keeps them: ``add_calls_to_rollups`` adds a set of ``llm_calls`` rows to all three
grains (an upsert that adds sums and merges histograms). The cost projection calls it for
each batch it writes; a rebuild builds them the same way; ``recount_rollups`` recounts a time
range from ``llm_calls`` after its rows were changed in place (by a reprice). Rows without a
tenant (calls of a dead-lettered session) are shown by no dashboard and are not rolled up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import Cursor, sql

from flowledger.domain.pricing import TOKEN_FIELDS
from flowledger.projections.latency_sketch import bucket_sql
from flowledger.projections.sql import names_hash
from flowledger.projections.windows import GRAINS, ceil, floor

KEY = ("tenant", "workflow", "step", "source", "model", "provider", "error_type")
"""The dimensions of a roll-up row, besides its grain and bucket start ``at``."""
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("input_tokens", "input_tokens", "bigint"),
    ("output_tokens", "output_tokens", "bigint"),
    ("cache_read_input_tokens", "cache_read_input_tokens", "bigint"),
    ("reasoning_output_tokens", "reasoning_output_tokens", "bigint"),
    ("cache_creation_input_tokens", "cache_creation_input_tokens", "bigint"),
    ("cache_creation_1h_input_tokens", "cache_creation_1h_input_tokens", "bigint"),
    ("audio_input_tokens", "audio_input_tokens", "bigint"),
    ("audio_output_tokens", "audio_output_tokens", "bigint"),
    ("cost_usd", "cost_usd", "numeric"),
    ("retried_cost_usd", "retried_cost_usd", "numeric"),
    ("unpriced_calls", "unpriced::integer", "bigint"),
    *((f"retried_{name}", f"retried_{name}", "bigint") for name in TOKEN_FIELDS),
)
"""Summed per roll-up row: (column, its expression over an ``llm_calls`` row, type)."""
SUMS = tuple(name for name, _, _ in MEASURES)

DDL = f"""
CREATE TABLE {{s}}.cost_rollups (
    grain text NOT NULL,
    at timestamptz NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    step text NOT NULL,
    source text NOT NULL,
    model text,
    provider text,
    error_type text,
    calls bigint NOT NULL,
    {" ".join(f"{name} {kind} NOT NULL," for name, _, kind in MEASURES)}
    latency_calls bigint NOT NULL,
    latency_sum_ms numeric NOT NULL,
    latency_buckets integer[] NOT NULL,
    latency_counts bigint[] NOT NULL,
    -- The key's names (up to 200 characters each, 600 bytes in a CJK script) are keyed by their
    -- SHA-256, as funnel_paths' paths are: a btree key holds at most 2,704 bytes, and a call
    -- whose tenant, workflow, step, model and provider were that long was a dead letter.
    key_hash bytea NOT NULL,
    UNIQUE (grain, at, key_hash)
);
CREATE INDEX ON {{s}}.cost_rollups (tenant, grain, at);
"""
# The latency sum is numeric: summed in any order (batch sizes differ between a live build
# and a rebuild) it comes out the same, so ``projections verify`` finds no float noise.

_KEY = ", ".join(KEY)
KEY_HASH = names_hash(*KEY)
"""A roll-up row's key (``KEY``) as one value: a None (no model) is JSON null, not a name."""
_ADD = f"""
WITH cells AS (
    SELECT {_KEY}, date_trunc('minute', occurred_at, 'UTC') AS minute,
           {bucket_sql("latency_ms")} AS bucket, count(*) AS calls,
           {", ".join(f"sum({expr}) AS {name}" for name, expr, _ in MEASURES)},
           count(latency_ms) AS latency_calls, coalesce(sum(latency_ms::numeric), 0) AS latency_sum_ms
    FROM {{s}}.llm_calls
    WHERE tenant IS NOT NULL AND ({{where}})
    GROUP BY {_KEY}, minute, bucket
), grained AS (
    SELECT g.grain, date_trunc(g.grain, c.minute, 'UTC') AS at, {_KEY}, bucket, sum(calls) AS calls,
           {", ".join(f"sum({c}) AS {c}" for c in SUMS)},
           sum(latency_calls) AS latency_calls, sum(latency_sum_ms) AS latency_sum_ms
    FROM cells AS c CROSS JOIN unnest(%(grains)s::text[]) AS g(grain)
    GROUP BY g.grain, 2, {_KEY}, bucket
)
INSERT INTO {{s}}.cost_rollups AS r
SELECT grain, at, {_KEY}, sum(calls), {", ".join(f"sum({c})" for c in SUMS)},
       sum(latency_calls), sum(latency_sum_ms),
       coalesce(array_agg(bucket ORDER BY bucket) FILTER (WHERE bucket IS NOT NULL), '{{{{}}}}'),
       coalesce(array_agg(latency_calls ORDER BY bucket) FILTER (WHERE bucket IS NOT NULL), '{{{{}}}}'),
       {KEY_HASH}
FROM grained GROUP BY grain, at, {_KEY}
ON CONFLICT (grain, at, key_hash) DO UPDATE SET
    calls = r.calls + EXCLUDED.calls,
    {", ".join(f"{c} = r.{c} + EXCLUDED.{c}" for c in SUMS)},
    latency_calls = r.latency_calls + EXCLUDED.latency_calls,
    latency_sum_ms = r.latency_sum_ms + EXCLUDED.latency_sum_ms,
    (latency_buckets, latency_counts) = (
        SELECT coalesce(array_agg(b ORDER BY b), '{{{{}}}}'), coalesce(array_agg(n ORDER BY b), '{{{{}}}}')
        FROM (SELECT b, sum(n)::bigint FROM (
                  SELECT * FROM unnest(r.latency_buckets, r.latency_counts)
                  UNION ALL SELECT * FROM unnest(EXCLUDED.latency_buckets, EXCLUDED.latency_counts)
              ) AS u(b, n) GROUP BY b) AS m(b, n)
    )
"""


def add_to_rollups(cur: Cursor[Any], schema: str, first_id: int, last_id: int) -> None:
    """Add the ``llm_calls`` rows with ``first_id <= id <= last_id`` to every grain's roll-up
    (a bulk build whose range holds no row added before, such as the bench's)."""
    where = sql.SQL("id BETWEEN %(first)s AND %(last)s")
    _add(cur, schema, where, {"first": first_id, "last": last_id})


def add_calls_to_rollups(cur: Cursor[Any], schema: str, ids: list[int] | None = None) -> None:
    """Add the ``llm_calls`` rows with these ids (every row: None) to every grain's roll-up.

    Each row must be added once: the cost projection calls this for the rows of the batch
    it has just written (by id, not by range: a build may also hold archived sessions' rows
    whose ids fall inside a batch's range, ``archived.py``), and for every row once, in an
    empty build that has just been given the archived sessions' rows.
    """
    if ids is None:
        _add(cur, schema, sql.SQL("true"), {})
    else:
        _add(cur, schema, sql.SQL("id = ANY(%(ids)s)"), {"ids": ids})


def recount_rollups(cur: Cursor[Any], schema: str, since: datetime, until: datetime | None) -> None:
    """Recount the roll-ups of every day touching ``[since, until)`` from ``llm_calls`` (for a
    change made to those rows in place, such as new prices applied to their cost)."""
    start = floor(since, "day")
    end = None if until is None else ceil(until, "day")
    params = {"start": start, "end": end}
    cur.execute(
        sql.SQL(
            "DELETE FROM {}.cost_rollups"
            " WHERE at >= %(start)s AND (%(end)s::timestamptz IS NULL OR at < %(end)s)"
        ).format(sql.Identifier(schema)),
        params,
    )
    where = sql.SQL("occurred_at >= %(start)s AND (%(end)s::timestamptz IS NULL OR occurred_at < %(end)s)")
    _add(cur, schema, where, params)


def _add(cur: Cursor[Any], schema: str, where: sql.Composable, params: dict[str, Any]) -> None:
    statement = sql.SQL(_ADD).format(s=sql.Identifier(schema), where=where)
    cur.execute(statement, {**params, "grains": list(GRAINS)})
