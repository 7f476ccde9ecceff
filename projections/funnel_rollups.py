"""Roll-ups of the completion funnel, per minute, hour and day of the sessions' start (UTC):

- ``funnel_paths``: how many sessions of a tenant, workflow, first model and status took
  each path: the steps in the order first reached, each with whether it was processed and,
  if its last outcome was a failure, the error type. Every funnel number (reached, processed,
  furthest step, why sessions stopped, previous steps) follows from the paths and counts.
- ``funnel_reach``: per step and first model, sessions reaching it and a histogram of the
  seconds from the session's start to the step (``latency_sketch``).
- ``funnel_firsts``: per step, the earliest time it was reached (orders steps on a tie).

A session's row changes as it goes on, so the funnel projection calls ``change_funnel_rollups``
twice per batch: with ``-1`` for the touched sessions as they were, then ``+1`` as they are.
Counts reaching zero are removed, so a rebuild in any batch size gives the same rows. The
earliest times only ever go down and never depend on what changes, so they are only added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import Cursor, sql

from flowledger.projections.latency_sketch import bucket_sql
from flowledger.projections.sql import names_hash
from flowledger.projections.windows import GRAINS

DDL = """
CREATE TABLE {s}.funnel_paths (
    grain text NOT NULL,
    at timestamptz NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    first_model text,
    status text NOT NULL,
    path jsonb NOT NULL,
    sessions bigint NOT NULL,
    -- A path is as long as the steps it holds (up to 200 characters a name): keyed by its
    -- SHA-256 (of jsonb's canonical text), as a btree key holds at most 2,704 bytes.
    path_hash bytea NOT NULL,
    UNIQUE NULLS NOT DISTINCT (tenant, workflow, grain, at, first_model, status, path_hash)
);
CREATE INDEX ON {s}.funnel_paths (sessions) WHERE sessions = 0;
CREATE TABLE {s}.funnel_reach (
    grain text NOT NULL,
    at timestamptz NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    first_model text,
    step text NOT NULL,
    reached bigint NOT NULL,
    seconds_buckets integer[] NOT NULL,
    seconds_counts bigint[] NOT NULL,
    -- Keyed by the SHA-256 of its names, as the paths are: four names of 200 characters of four
    -- bytes made a key of 3,240 bytes, past the 2,704 a btree key holds (a dead letter).
    key_hash bytea NOT NULL,
    UNIQUE (grain, at, key_hash)
);
CREATE INDEX ON {s}.funnel_reach (tenant, workflow, grain, at);
CREATE INDEX ON {s}.funnel_reach (reached) WHERE reached = 0;
CREATE TABLE {s}.funnel_firsts (
    grain text NOT NULL,
    at timestamptz NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    step text NOT NULL,
    first_reached_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, workflow, grain, at, step)
);
"""

SESSIONS = """
SELECT s.originator_id, s.tenant, s.workflow, s.started_at, s.first_model, s.status, p.path
FROM {s}.funnel_sessions AS s
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_agg(jsonb_build_array(
               f.step, f.processed > 0,
               CASE WHEN f.last_outcome = 'failed' THEN coalesce(f.last_error_type, '') END
           ) ORDER BY f.reach_order), '[]'::jsonb) AS path
    FROM {s}.funnel_steps AS f WHERE f.originator_id = s.originator_id
) AS p
WHERE {where}
"""
"""Each selected session with its path: ``[[step, processed, error type if it last failed]...]``
in the order reached (the empty string stands for a failure without a type)."""

REACHES = """
SELECT s.tenant, s.workflow, s.started_at, s.first_model, f.step, f.first_reached_at,
       {bucket} AS bucket
FROM {s}.funnel_sessions AS s JOIN {s}.funnel_steps AS f USING (originator_id)
WHERE {where}
"""
"""Each step reached by a selected session, with the bucket of the seconds it took."""

_CHANGE = f"""
WITH grains AS (SELECT unnest(%(grains)s::text[]) AS grain),
sessions AS ({SESSIONS}),
reaches AS ({REACHES}),
paths AS (
    INSERT INTO {{s}}.funnel_paths AS r
        (grain, at, tenant, workflow, first_model, status, path, sessions, path_hash)
    SELECT g.grain, date_trunc(g.grain, started_at, 'UTC'), tenant, workflow, first_model, status, path,
           %(sign)s * count(*), sha256(convert_to(path::text, 'UTF8'))
    FROM sessions CROSS JOIN grains AS g GROUP BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (tenant, workflow, grain, at, first_model, status, path_hash)
    DO UPDATE SET sessions = r.sessions + EXCLUDED.sessions
    RETURNING 1
), cells AS (
    SELECT g.grain, date_trunc(g.grain, started_at, 'UTC') AS at, tenant, workflow, first_model, step,
           bucket, count(*) AS n
    FROM reaches CROSS JOIN grains AS g GROUP BY 1, 2, 3, 4, 5, 6, 7
), reach AS (
    INSERT INTO {{s}}.funnel_reach AS r
    SELECT grain, at, tenant, workflow, first_model, step, %(sign)s * sum(n),
           array_agg(bucket ORDER BY bucket), array_agg(%(sign)s * n ORDER BY bucket),
           {names_hash("tenant", "workflow", "first_model", "step")}
    FROM cells GROUP BY 1, 2, 3, 4, 5, 6
    ON CONFLICT (grain, at, key_hash) DO UPDATE SET
        reached = r.reached + EXCLUDED.reached,
        (seconds_buckets, seconds_counts) = (
            SELECT coalesce(array_agg(b ORDER BY b), '{{{{}}}}'),
                   coalesce(array_agg(n ORDER BY b), '{{{{}}}}')
            FROM (SELECT b, sum(n)::bigint FROM (
                      SELECT * FROM unnest(r.seconds_buckets, r.seconds_counts)
                      UNION ALL SELECT * FROM unnest(EXCLUDED.seconds_buckets, EXCLUDED.seconds_counts)
                  ) AS u(b, n) GROUP BY b HAVING sum(n) <> 0) AS m(b, n)
        )
    RETURNING 1
), firsts AS (
    INSERT INTO {{s}}.funnel_firsts AS r
    SELECT g.grain, date_trunc(g.grain, started_at, 'UTC'), tenant, workflow, step, min(first_reached_at)
    FROM reaches CROSS JOIN grains AS g WHERE %(sign)s > 0 GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (tenant, workflow, grain, at, step)
    DO UPDATE SET first_reached_at = least(r.first_reached_at, EXCLUDED.first_reached_at)
    RETURNING 1
)
SELECT (SELECT count(*) FROM paths), (SELECT count(*) FROM reach), (SELECT count(*) FROM firsts)
"""


def seconds_bucket_sql() -> str:
    """The histogram bucket of a step's seconds from its session's start (``s`` and ``f`` rows)."""
    return bucket_sql("extract(epoch FROM f.first_reached_at - s.started_at)::double precision")


def change_funnel_rollups(cur: Cursor[Any], schema: str, sessions: Sequence[UUID], sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) the sessions' rows, as they are now, to the roll-ups."""
    if sessions:
        _change(cur, schema, sql.SQL("s.originator_id = ANY(%(ids)s)"), {"ids": list(sessions)}, sign)


def add_started_to_rollups(cur: Cursor[Any], schema: str, since: Any, until: Any) -> None:
    """Add every session started in ``[since, until)`` (for a bulk build, such as the bench's)."""
    where = sql.SQL("s.started_at >= %(since)s AND s.started_at < %(until)s")
    _change(cur, schema, where, {"since": since, "until": until}, 1)


def _change(cur: Cursor[Any], schema: str, where: sql.Composable, params: dict[str, Any], sign: int) -> None:
    statement = sql.SQL(_CHANGE).format(
        s=sql.Identifier(schema),
        where=where,
        bucket=sql.SQL(seconds_bucket_sql()),  # type: ignore[arg-type]
    )
    cur.execute(statement, {**params, "sign": sign, "grains": list(GRAINS)})
    if sign < 0:
        cur.execute(sql.SQL("DELETE FROM {}.funnel_paths WHERE sessions = 0").format(sql.Identifier(schema)))
        cur.execute(sql.SQL("DELETE FROM {}.funnel_reach WHERE reached = 0").format(sql.Identifier(schema)))
