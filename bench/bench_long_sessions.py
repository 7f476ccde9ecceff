"""Long sessions: does a step cost the same at step 10,000 as at step 10, and what is stored?

Figures (issue 11's goals beside each):

- ``record_step`` rate over 200 steps from step 10 of a new session and from step 10,000 of
  the long one, one writer, every step with an idempotency key (the Dify case), in
  ``ROUNDS`` interleaved pairs (a new session each time, in a schema of its own so that
  the storage figures below count the long session alone), medians: ratio goal >= 0.8.
  One pair of 200-step windows (0.15 s each) moved between 0.74x and 1.11x from run to run
  on an idle machine; the medians of interleaved pairs do not follow one slow moment;
- the size of that session's latest snapshot (goal: bounded, < 64 KiB), and of a session of
  ``--large-steps`` steps (2,000) carrying about 4 KB of input and output each, a realistic
  LLM step (the window is bounded by bytes as well as by count: ``WINDOW_BYTES``);
- bytes stored per step, events and snapshots with their indexes, beside a plain table
  holding the same event rows (goal <= 2 KB per step);
- the current state of a 1,000-step session read by a fresh engine (goal <= 5 ms; the
  peers' figures in the issue: LangGraph ``get_state`` 4.9 ms, DBOS 9.4 ms).

Run: ``.venv/bin/python bench/bench_long_sessions.py [--steps 10000] [--large-steps 2000]``
(``--large-only``: that 4 KB row alone, e.g. ``--large-only --large-steps 200``). Uses
FLOWLEDGER_DATABASE_URL, else 127.0.0.1:5432 (db ``test``), in a scratch schema it drops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import INPUT, OUTPUT, USAGE, database_url, scratch_schema

from flowledger.infrastructure import Engine, Settings

WINDOW = 200
ROUNDS = 5
LARGE_INPUT = {"prompt": "p" * 2_500, "history": "Where is my order? " * 20}
LARGE_OUTPUT = {"reply": "r" * 1_300, "intent": "order_status"}
"""A step of about 4 KB of input and output (a prompt with its context, a model's answer)."""


def engine(url: str, schema: str) -> Engine:
    return Engine(
        settings=Settings(home=Path("/nonexistent")).with_overrides(database_url=url, schema=schema)
    )


def record(eng: Engine, session_id: str, start: int, count: int) -> float:
    """Record steps ``start .. start+count-1``; returns steps per second."""
    began = time.perf_counter()
    for n in range(start, start + count):
        eng.record_step(
            session_id, "answer", input=INPUT, output=OUTPUT, usage=USAGE, idempotency_key=f"k-{n}"
        )
    return count / (time.perf_counter() - began)


def relation_bytes(url: str, schema: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (f"{schema}.{table}",)).fetchone()
    return int(row[0]) if row else 0


def latest_snapshot_bytes(url: str, schema: str, eng: Engine, session_id: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT length(state) FROM {schema}.flowledger_snapshots WHERE originator_id = %s "
            "ORDER BY originator_version DESC LIMIT 1",
            (eng.session_uuid(session_id),),
        ).fetchone()
    return int(row[0]) if row else 0


def plain_copy_bytes(url: str, schema: str) -> int:
    """The same event rows in a plain table (the library's columns, its primary key)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.plain AS SELECT originator_id, originator_version, topic, state "
            f"FROM {schema}.flowledger_events"
        )
        conn.execute(f"ALTER TABLE {schema}.plain ADD PRIMARY KEY (originator_id, originator_version)")
    return relation_bytes(url, schema, "plain")


def large_step_snapshot(url: str, steps: int) -> tuple[int, int]:
    """The latest snapshot's bytes of a session of ``steps`` keyed ~4 KB steps, and the steps its
    window keeps (in a scratch schema of its own, so the storage figures count the long session)."""
    with scratch_schema(url, "bench_large") as schema:
        eng = engine(url, schema)
        try:
            eng.start_session("large", "customer_service")
            for n in range(steps):
                eng.record_step(
                    "large",
                    "answer",
                    input=LARGE_INPUT,
                    output=LARGE_OUTPUT,
                    usage=USAGE,
                    idempotency_key=f"k-{n}",
                )
            return latest_snapshot_bytes(url, schema, eng, "large"), len(eng.get_session("large").history)
        finally:
            eng.close()


def large_row(table: Table, steps: int, snapshot: int, kept: int) -> None:
    table.add_row(
        f"latest snapshot, {steps:,} steps of ~4 KB input+output ({kept} kept in the window)",
        f"{snapshot:,} B",
        "65,536 B",
        f"{snapshot / 65536:.2f} (goal < 1)",
    )


def fresh_reads(url: str, schema: str, session_id: str, rounds: int = 15) -> float:
    """Median ms for a new engine's first ``get_session``: started and connected, nothing cached."""
    times = []
    for _ in range(rounds):
        eng = engine(url, schema)
        eng.log.head()  # a started engine has its connection; the session itself is not cached
        began = time.perf_counter()
        eng.get_session(session_id)
        times.append((time.perf_counter() - began) * 1000)
        eng.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--large-steps", type=int, default=2_000, help="steps of ~4 KB (0: skip that row)")
    parser.add_argument("--large-only", action="store_true", help="only the ~4 KB steps' snapshot row")
    args = parser.parse_args()
    url = database_url()
    console = Console()
    if args.large_only:
        table = Table(title="Long sessions: snapshot of ~4 KB steps")
        for column in ("figure", "measured", "compared with", "ratio / goal"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        large_row(table, args.large_steps, *large_step_snapshot(url, args.large_steps))
        console.print(table)
        return
    with scratch_schema(url, "bench_long") as schema, scratch_schema(url, "bench_short") as short_schema:
        eng = engine(url, schema)
        short = engine(url, short_schema)
        eng.start_session("long", "customer_service", ttl=__import__("datetime").timedelta(days=30))
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("filling one session", total=args.steps + ROUNDS * WINDOW)
            done = 0
            while done < args.steps - 1:
                chunk = min(500, args.steps - 1 - done)
                record(eng, "long", done + 1, chunk)
                done += chunk
                progress.advance(task, chunk)
            early_rates, late_rates = [], []
            for number in range(ROUNDS):
                session_id = f"early-{number}"
                short.start_session(session_id, "customer_service")
                record(short, session_id, 1, 9)
                early_rates.append(record(short, session_id, 10, WINDOW))
                late_rates.append(record(eng, "long", args.steps + number * WINDOW, WINDOW))
                progress.advance(task, WINDOW)
        short.close()
        early, late = statistics.median(early_rates), statistics.median(late_rates)
        steps = eng.get_session("long").step_count
        snapshot = latest_snapshot_bytes(url, schema, eng, "long")
        stored = relation_bytes(url, schema, "flowledger_events") + relation_bytes(
            url, schema, "flowledger_snapshots"
        )
        plain = plain_copy_bytes(url, schema)

        eng.start_session("thousand", "customer_service")
        record(eng, "thousand", 1, 1000)
        eng.close()
        read_ms = fresh_reads(url, schema, "thousand")
    large = large_step_snapshot(url, args.large_steps) if args.large_steps > 0 else None

    table = Table(title=f"Long sessions ({steps:,} steps in one session)")
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("compared with", justify="right")
    table.add_column("ratio / goal", justify="right")
    pairs = sorted(
        late_rate / early_rate for late_rate, early_rate in zip(late_rates, early_rates, strict=True)
    )
    table.add_row(
        f"record_step at step {args.steps:,} vs step 10 (medians of {ROUNDS})",
        f"{late:,.0f}/s",
        f"{early:,.0f}/s",
        f"{late / early:.2f}x (goal >= 0.8x; pairs {pairs[0]:.2f}-{pairs[-1]:.2f})",
    )
    table.add_row(
        "latest snapshot of that session", f"{snapshot:,} B", "65,536 B", f"{snapshot / 65536:.2f} (goal < 1)"
    )
    if large is not None:
        large_row(table, args.large_steps, *large)
    table.add_row(
        "bytes stored per step (events + snapshots)",
        f"{stored / steps:,.0f} B",
        f"plain rows {plain / steps:,.0f} B",
        f"{stored / plain:.2f}x plain (goal <= 2,048 B)",
    )
    table.add_row(
        "fresh engine reads a 1,000-step session",
        f"{read_ms:.2f} ms",
        "5 ms",
        f"{read_ms / 5:.2f} (goal <= 1)",
    )
    console.print(table)


if __name__ == "__main__":
    main()
