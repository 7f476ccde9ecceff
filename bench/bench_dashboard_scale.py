"""Dashboard and funnel at scale: 20M step events' rows, 30-day window, roll-ups beside raw rows.

Run: ``.venv/bin/python bench/bench_dashboard_scale.py [--events 20000000] [--repeats 20]
[--raw-repeats 3] [--keep]``. Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432
(db ``test``), else an embedded PostgreSQL; works in a scratch schema dropped afterwards.

How the data is made (the log is not replayed: at 1-3k events/s that alone would take hours):

1. The cost and funnel projections create their tables in the scratch schema (their own DDL).
2. ``--events`` step events are written straight into the projections' raw tables with one
   ``INSERT … SELECT`` over ``generate_series`` each: sessions of 1-5 model steps (3 on
   average), started evenly over the last 45 days, 90 % of them tenant ``acme`` (the one
   queried); per step a model of four (and its provider), 200-2,200 input and 20-520 output
   tokens, a cost from them, a log-normal latency (median ~500 ms), 3 % errors of three
   types. Every value is a hash of the session and step numbers (``hashint8``), so both
   tables describe the same steps: ``llm_calls`` (one row per step event) and
   ``funnel_steps`` (one per session and step), plus ``funnel_sessions`` (one per session:
   70 % completed, 10 % expired, 5 % abandoned, the rest open; the first step's model).
3. The roll-ups are built by the projections' own maintenance code: ``add_to_rollups`` over
   ``llm_calls`` id ranges (the same aggregation the cost projection runs for each batch's
   calls, ``add_calls_to_rollups``) and ``add_started_to_rollups`` over each day of session
   starts (the funnel projection's own statement, for a batch's sessions)
   (with ``work_mem`` at 256 MB while building; the queries run with the server's default).

Then the dashboard (by model, and by workflow and step) and the funnel of the busiest
workflow are asked for the last 30 days, ``--repeats`` times from the roll-ups
(``read="rollups"``) and ``--raw-repeats`` times from the raw rows (``read="raw"``), through
the same ``dashboard`` / ``funnel_report`` functions; p50 and p95 of each are printed, with the
goal (roll-up p95 <= 1 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from flowledger.projections import dashboard, funnel_report
from flowledger.projections.cost import CostDashboard
from flowledger.projections.cost_rollups import add_to_rollups
from flowledger.projections.funnel import CompletionFunnel
from flowledger.projections.funnel_rollups import add_started_to_rollups

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url, scratch_schema

DAYS = 45
GOAL_SECONDS = 1.0
STEPS = 5  # ids are session * 8 + step, so an id range is a range of sessions

# u(k): a uniform [0, 1) number from the integer k; the same k gives the same number in every
# statement, which is how llm_calls and the funnel tables agree without a staging table.
U = "((hashint8({k}) & 2147483647)::float8 / 2147483648)"


def u(expr: str, salt: int) -> str:
    """SQL for a uniform number drawn from ``expr`` (an integer expression) and ``salt``."""
    return U.format(k=f"(({expr}) * 16 + {salt})")


LENGTH = f"(1 + floor({u('n', 1)} * {STEPS})::int)"  # steps in session n: 1..5
MODELS = "ARRAY['deepseek-v3.2','gpt-4.1','gemini-2.5-flash','claude-sonnet-4.5']"
MODEL = f"({MODELS})[1 + floor({u('n * 8 + p', 2)} * 4)::int]"
ERROR = (
    f"CASE WHEN {u('n * 8 + p', 3)} < 0.03 THEN"
    f" (ARRAY['timeout','http_429','rate_limited'])[1 + floor({u('n * 8 + p', 4)} * 3)::int] END"
)
STATUS = (
    f"CASE WHEN {u('n', 5)} < 0.70 THEN 'completed' WHEN {u('n', 5)} < 0.80 THEN 'expired'"
    f" WHEN {u('n', 5)} < 0.85 THEN 'abandoned' ELSE 'active' END"
)
STEP = "(ARRAY['intent_classification','skill_matching','answer','escalation','session_complete'])[p + 1]"
TENANT = "CASE WHEN n %% 10 = 0 THEN 'other' ELSE 'acme' END"
WORKFLOW = "'workflow-' || (n %% 4)"
STARTED = "%(start)s::timestamptz + (n * %(gap)s::float8) * interval '1 second'"
AT = f"{STARTED} + (p * 20 + floor({u('n * 8 + p', 6)} * 15)) * interval '1 second'"
SESSIONS = "generate_series(%(first)s::bigint, %(last)s::bigint) AS n"
STEPS_OF = f"generate_series(0, {LENGTH} - 1) AS p"

CALLS = f"""
INSERT INTO {{s}}.llm_calls
SELECT n * 8 + p, 'session', md5('s' || n)::uuid, p + 2, 's' || n, {WORKFLOW}, {STEP}, {ERROR}, provider,
       model, model, model, input_tokens, output_tokens, 0, 0,
       round((input_tokens * 0.27 + output_tokens * 1.10) / 1000000, 8),
       '2026-01', CASE WHEN {ERROR} = 'timeout' THEN NULL ELSE
           exp(6.2 + 0.9 * ({u("n * 8 + p", 7)} + {u("n * 8 + p", 8)} + {u("n * 8 + p", 9)} - 1.5) * 2) END,
       1, {AT}, {TENANT}
FROM {SESSIONS}, {STEPS_OF},
     LATERAL (SELECT {MODEL} AS model) AS m,
     LATERAL (SELECT split_part(model, '-', 1) AS provider,
                     200 + floor({u("n * 8 + p", 10)} * 2000)::bigint AS input_tokens,
                     20 + floor({u("n * 8 + p", 11)} * 500)::bigint AS output_tokens) AS t
"""
FUNNEL_STEPS = f"""
INSERT INTO {{s}}.funnel_steps
SELECT md5('s' || n)::uuid, {STEP}, {WORKFLOW}, {AT}, p + 1,
       CASE WHEN {ERROR} IS NULL THEN 1 ELSE 0 END, CASE WHEN {ERROR} IS NULL THEN 0 ELSE 1 END,
       CASE WHEN {ERROR} IS NULL THEN 'processed' ELSE 'failed' END, {ERROR}, {TENANT}
FROM {SESSIONS}, {STEPS_OF}
"""
FUNNEL_SESSIONS = f"""
INSERT INTO {{s}}.funnel_sessions
SELECT md5('s' || n)::uuid, {WORKFLOW}, 's' || n, {STARTED}, {STATUS}, '{{{{}}}}'::jsonb,
       (SELECT {MODEL} FROM (SELECT 0 AS p) AS z), {LENGTH}, {TENANT}
FROM {SESSIONS}
"""


def generate(conn: psycopg.Connection[Any], schema: str, events: int, out: Console) -> tuple[int, int]:
    """Fill the raw tables with about ``events`` step events; return (sessions, calls)."""
    sessions = max(events // 3, 1)
    now = datetime.now(UTC).replace(microsecond=0)
    params = {"start": now - timedelta(days=DAYS), "gap": DAYS * 86400 / sessions}
    chunk = 500_000
    for statement, name in (
        (CALLS, "llm_calls"),
        (FUNNEL_STEPS, "funnel_steps"),
        (FUNNEL_SESSIONS, "funnel_sessions"),
    ):
        began = time.perf_counter()
        for first in range(0, sessions, chunk):
            last = min(first + chunk, sessions) - 1
            conn.execute(
                sql.SQL(statement).format(s=sql.Identifier(schema)), {**params, "first": first, "last": last}
            )
        out.print(f"  {name}: {time.perf_counter() - began:.0f} s")
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.llm_calls").format(sql.Identifier(schema))).fetchone()
    return sessions, int(row[0]) if row else 0


def build_rollups(conn: psycopg.Connection[Any], schema: str, sessions: int, out: Console) -> None:
    """The roll-ups, by the projections' own maintenance functions."""
    began = time.perf_counter()
    step = 200_000
    for first in range(0, sessions, step):
        with conn.transaction(), conn.cursor() as cur:
            add_to_rollups(cur, schema, first * 8, (first + step) * 8 - 1)
    out.print(f"  cost_rollups (add_to_rollups): {time.perf_counter() - began:.0f} s")
    began = time.perf_counter()
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=DAYS + 1)
    while day <= datetime.now(UTC):
        with conn.transaction(), conn.cursor() as cur:
            add_started_to_rollups(cur, schema, day, day + timedelta(days=1))
        day += timedelta(days=1)
    out.print(f"  funnel roll-ups (add_started_to_rollups): {time.perf_counter() - began:.0f} s")


def timed(action: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return times


def p95(values: list[float]) -> float:
    """percentile_cont(0.95) of the timings."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * 0.95
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def main() -> None:
    """Generate, build the roll-ups, time the queries both ways, print, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000_000, help="step events (rows of llm_calls)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each roll-up query")
    parser.add_argument("--raw-repeats", type=int, default=3, help="timed runs of each raw query")
    args = parser.parse_args()
    out = Console()
    url = database_url()
    with scratch_schema(url, "bench_scale") as schema, psycopg.connect(url, autocommit=True) as conn:
        began = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            CostDashboard().create(cur, schema)
            CompletionFunnel().create(cur, schema)
        out.print(f"generating {args.events:,} step events' rows in {schema}")
        # Bulk building only: room to sort and hash in memory. The queries run with the default.
        conn.execute("SET work_mem = '256MB'")
        sessions, calls = generate(conn, schema, args.events, out)
        build_rollups(conn, schema, sessions, out)
        conn.execute("RESET work_mem")
        conn.execute(sql.SQL("ANALYZE {}.llm_calls").format(sql.Identifier(schema)))
        for table in (
            "cost_rollups",
            "funnel_sessions",
            "funnel_steps",
            "funnel_paths",
            "funnel_reach",
            "funnel_firsts",
        ):
            conn.execute(sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        setup = time.perf_counter() - began
        sizes = dict(
            conn.execute(
                "SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                [schema],
            ).fetchall()
        )
        since = datetime.now(UTC) - timedelta(days=30)
        queries: dict[str, Callable[[str], object]] = {
            "dashboard by model": lambda read: dashboard(
                conn, schema, tenant="acme", since=since, by=["model"], read=read
            ),
            "dashboard by workflow, step": lambda read: dashboard(
                conn, schema, tenant="acme", since=since, by=["workflow", "step"], read=read
            ),
            "funnel workflow-1": lambda read: funnel_report(
                conn, schema, "workflow-1", tenant="acme", since=since, read=read
            ),
        }
        table = Table(title=f"30-day window over {calls:,} llm_calls rows ({sessions:,} sessions), seconds")
        for column in (
            "query",
            "roll-ups p50",
            "roll-ups p95",
            "raw p50",
            "raw p95",
            "raw / roll-ups (p50)",
            "goal p95 <= 1 s",
        ):
            table.add_column(column, justify="left" if column == "query" else "right")
        for name, query in queries.items():
            query("rollups")  # warm the cache the same way for both sides
            rolled = timed(lambda q=query: q("rollups"), args.repeats)  # type: ignore[misc]
            raw = timed(lambda q=query: q("raw"), args.raw_repeats)  # type: ignore[misc]
            ratio = statistics.median(raw) / statistics.median(rolled)
            table.add_row(
                name,
                f"{statistics.median(rolled):.3f}",
                f"{p95(rolled):.3f}",
                f"{statistics.median(raw):.2f}",
                f"{p95(raw):.2f}",
                f"{ratio:,.0f}x",
                "met" if p95(rolled) <= GOAL_SECONDS else "MISSED",
            )
        out.print(table)
        mib = {name: size / 2**20 for name, size in sorted(sizes.items())}
        out.print("table sizes (MiB, with indexes): " + ", ".join(f"{k} {v:,.0f}" for k, v in mib.items()))
        out.print(
            f"setup (generate + roll-ups): {setup:.0f} s;"
            f" {args.repeats} roll-up and {args.raw_repeats} raw runs per query"
        )


if __name__ == "__main__":
    main()
