"""Durable step recording, one commit per step, with 1, 8 and 32 writers, side by side:

Recorder level (the goals of issue 6: how a step's event is written):

- recorder: flowledger's recorder alone (``insert_events`` of one stored StepProcessed event);
- stock recorder: the event library's own PostgreSQL recorder, ``insert_events`` of the same
  event (it takes ``LOCK TABLE … IN EXCLUSIVE MODE`` per save);
- plain insert: psycopg ``INSERT`` of the same rows (same columns, keys, payload bytes).

Engine level (what a caller of ``Engine.record_step`` gets, domain work included):

- flowledger: ``Engine.record_step`` (load, decide, append through flowledger's recorder),
  each writer on its own session, a fresh session every 25 steps (a conversation's length;
  that session start is one more commit inside the timed loop, not counted as a step);
- library stock: the same Engine on the event library's own recorder, which locks the table
  per save (``lock``), or uses its DB-function insert (``db functions``, no lock, has gaps);
- seed design: lock the session's state row ``FOR UPDATE``, update it, insert an execution row.

Each writer is a thread with a session of its own. Rounds are interleaved and the median
of each cell is printed, as the machine is shared. Every cell starts on an empty table of its
own; ``--warmup S`` first runs the same writes for S seconds, untimed, in every cell (the
first few hundred appends into an empty table cost flowledger's recorder more than the
plain insert, so a short cell is partly that). Run:
``.venv/bin/python bench/bench_step_recording.py [--seconds 1.5] [--rounds 3] [--writers 1 8 32]
[--warmup 0.5]``.
Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``); works in
scratch schemas that it drops.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from eventsourcing.persistence import StoredEvent
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    INPUT,
    OUTPUT,
    USAGE,
    database_url,
    engine_writers,
    median,
    run_writers,
    scratch_schema,
)

import flowledger.infrastructure.engine.facade as engine_module
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import create_schema

RECORDER_CASES = ("recorder", "stock_recorder")
ENGINE_CASES = ("flowledger", "flowledger_group", "stock_lock", "stock_db_functions", "seed")
CASES = (*RECORDER_CASES, "plain", *ENGINE_CASES)
LABELS = {
    "recorder": "flowledger recorder",
    "stock_recorder": "stock recorder (lock)",
    "plain": "plain insert",
    "flowledger": "flowledger Engine",
    "flowledger_group": "Engine, group commit",
    "stock_lock": "Engine on stock (lock)",
    "stock_db_functions": "Engine on stock (DB functions)",
    "seed": "seed design",
}
Writer = Callable[[int], Callable[[], None]]


@contextmanager
def engine_on(
    url: str, schema: str, writers: int, stock: str | None, *, group_commit: bool = False
) -> Iterator[Engine]:
    """An Engine; with ``stock``, built on the library's own PostgreSQL factory instead."""
    original, original_schema = engine_module.library_env, engine_module.ensure_schema

    def stock_env(*args: Any, **kwargs: Any) -> dict[str, str]:
        env = original(*args, **kwargs)
        env["PERSISTENCE_MODULE"] = "eventsourcing.postgres"
        env["POSTGRES_ENABLE_DB_FUNCTIONS"] = "y" if stock == "db_functions" else "n"
        env["CREATE_TABLE"] = "y"  # the library's own tables, not flowledger's migrated ones
        return env

    def schema_only(database_url: str, schema: str, *_: Any) -> None:
        create_schema(database_url, schema)

    if stock is not None:
        engine_module.library_env = stock_env  # type: ignore[assignment]
        engine_module.ensure_schema = schema_only  # type: ignore[assignment]
    try:
        settings = Settings(home=Path("/nonexistent")).with_overrides(
            database_url=url, schema=schema, pool_size=max(writers, 2), group_commit=group_commit
        )
        engine = Engine(settings=settings)
    finally:
        engine_module.library_env, engine_module.ensure_schema = original, original_schema
    try:
        yield engine
    finally:
        engine.close()


def recorder_writers(engine: Engine, row: tuple[str, bytes]) -> Writer:
    recorder = engine.log.recorder

    def make(i: int) -> Callable[[], None]:
        stream, version = uuid.uuid4(), [0]

        def step() -> None:
            version[0] += 1
            recorder.insert_events([StoredEvent(stream, version[0], row[0], row[1])])

        return step

    return make


def sample_row(url: str, schema: str) -> tuple[str, bytes]:
    """The topic and stored bytes of one real StepProcessed event, for the plain inserts."""
    with engine_on(url, schema, 1, None) as engine:
        engine.start_session("sample", "customer_service")
        engine.record_step("sample", "answer", input=INPUT, output=OUTPUT, usage=USAGE)
        stored = engine.log.recorder.select_events(engine.session_uuid("sample"))[-1]
    return stored.topic, stored.state


def plain_writers(url: str, schema: str, row: tuple[str, bytes], conns: list[Any]) -> Writer:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.events (originator_id uuid NOT NULL, "
            "originator_version bigint NOT NULL, topic text, state bytea, "
            "notification_id bigserial, PRIMARY KEY (originator_id, originator_version))"
        )
        conn.execute(f"CREATE UNIQUE INDEX ON {schema}.events (notification_id)")
    insert = (
        f"INSERT INTO {schema}.events (originator_id, originator_version, topic, state) "
        "VALUES (%s, %s, %s, %s)"
    )

    def make(i: int) -> Callable[[], None]:
        conn = psycopg.connect(url, autocommit=True)
        conns.append(conn)
        stream, version = uuid.uuid4(), [0]

        def step() -> None:
            version[0] += 1
            conn.execute(insert, (stream, version[0], row[0], row[1]), prepare=True)

        return step

    return make


SEED_DDL = """
CREATE TABLE {s}.workflow_states (id SERIAL PRIMARY KEY, session_id VARCHAR(255) NOT NULL UNIQUE,
  user_id VARCHAR(255), workflow_name VARCHAR(100) NOT NULL,
  current_step VARCHAR(100) NOT NULL DEFAULT 'init',
  context_data JSONB DEFAULT '{{}}', step_history JSONB DEFAULT '[]',
  created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
  expires_at TIMESTAMP, metadata JSONB DEFAULT '{{}}');
CREATE INDEX ON {s}.workflow_states(user_id);
CREATE INDEX ON {s}.workflow_states(expires_at);
CREATE TABLE {s}.workflow_executions (id SERIAL PRIMARY KEY,
  workflow_id INTEGER REFERENCES {s}.workflow_states(id), step_name VARCHAR(100), input_data JSONB,
  output_data JSONB, model_used VARCHAR(50), tokens_used INTEGER, cost_usd DECIMAL(10,6),
  latency_ms INTEGER, executed_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, error_message TEXT);
CREATE INDEX ON {s}.workflow_executions(workflow_id);
CREATE INDEX ON {s}.workflow_executions(executed_at);
"""


def seed_writers(url: str, schema: str, conns: list[Any]) -> Writer:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_DDL.format(s=schema))
    lock = f"SELECT id FROM {schema}.workflow_states WHERE session_id = %s FOR UPDATE"
    update = (
        f"UPDATE {schema}.workflow_states SET current_step = %s, context_data = context_data || %s, "
        "step_history = step_history || "
        "jsonb_build_object('step', %s::text, 'timestamp', now()::text), "
        "updated_at = CURRENT_TIMESTAMP WHERE id = %s"
    )
    insert = (
        f"INSERT INTO {schema}.workflow_executions (workflow_id, step_name, input_data, output_data, "
        "model_used, tokens_used, cost_usd, latency_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    )
    given, made = json.dumps(INPUT), json.dumps(OUTPUT)

    def make(i: int) -> Callable[[], None]:
        conn = psycopg.connect(url)
        conns.append(conn)
        session = f"seed-{i}"
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {schema}.workflow_states (session_id, workflow_name) VALUES (%s, %s)",
                (session, "customer_service"),
            )

        def step() -> None:
            with conn.transaction():
                row = conn.execute(lock, (session,), prepare=True).fetchone()
                assert row is not None
                conn.execute(update, ("answer", made, "answer", row[0]), prepare=True)
                conn.execute(
                    insert,
                    (
                        row[0],
                        "answer",
                        given,
                        made,
                        USAGE.response_model,
                        USAGE.input_tokens + USAGE.output_tokens,
                        USAGE.cost_usd,
                        int(USAGE.latency_ms),
                    ),
                    prepare=True,
                )

        return step

    return make


def measure(
    case: str, url: str, writers: int, seconds: float, row: tuple[str, bytes], warmup: float = 0.0
) -> float:
    """Steps per second for one case and writer count, in a scratch schema of its own."""
    with scratch_schema(url, "bench_steps") as schema:
        if case not in ("plain", "seed"):
            stock = {
                "stock_recorder": "lock",
                "stock_lock": "lock",
                "stock_db_functions": "db_functions",
            }.get(case)
            # Every row writes one transaction per append but "group commit", where
            # concurrent saves share transactions (an opt-in setting).
            alone = case in RECORDER_CASES
            grouped = case == "flowledger_group"
            with engine_on(url, schema, writers, stock, group_commit=grouped) as engine:
                make = recorder_writers(engine, row) if alone else engine_writers(engine)
                return run_writers(writers, seconds, make, warmup=warmup)
        conns: list[Any] = []
        try:
            if case == "plain":
                make = plain_writers(url, schema, row, conns)
            else:
                make = seed_writers(url, schema, conns)
            return run_writers(writers, seconds, make, warmup=warmup)
        finally:
            for conn in conns:
                conn.close()


def report(
    results: dict[tuple[str, int], list[float]], writer_counts: list[int], title: str, cases: tuple[str, ...]
) -> Table:
    """One table: the cases' medians, each with its ratio to the plain insert."""
    table = Table(title=title)
    table.add_column("writers", justify="right")
    for case in (*cases, "plain"):
        table.add_column(LABELS[case], justify="right")
    for writers in writer_counts:
        plain = median(results[("plain", writers)])
        cells = []
        for case in cases:
            value = median(results[(case, writers)])
            cells.append(f"{value:,.0f} ({value / plain:.2f}x)")
        table.add_row(str(writers), *cells, f"{plain:,.0f}")
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per cell per round")
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="untimed seconds of the same writes first, in every cell (on its own fresh table)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    url = database_url()
    console = Console(width=150)
    with scratch_schema(url, "bench_sample") as schema:
        row = sample_row(url, schema)
    results: dict[tuple[str, int], list[float]] = {}
    for round_no in range(args.rounds):
        for writers in args.writers:
            for case in CASES:
                rate = measure(case, url, writers, args.seconds, row, args.warmup)
                results.setdefault((case, writers), []).append(rate)
                console.print(f"round {round_no + 1}: {writers:>2} writers {case:<20} {rate:8,.0f} steps/s")
    command = ("bench/bench_step_recording.py " + " ".join(sys.argv[1:])).strip()
    console.print(
        report(
            results,
            args.writers,
            "Recorder level: one stored event per commit, "
            f"events/s (median), ratio to plain insert\n{command}",
            RECORDER_CASES,
        )
    )
    console.print(
        report(
            results,
            args.writers,
            "Engine level: Engine.record_step, one step per "
            f"commit, steps/s (median), ratio to plain insert\n{command}",
            ENGINE_CASES,
        )
    )
    for writers, goal in ((1, 0.8), (8, 0.6)):
        if ("plain", writers) in results:
            plain = median(results[("plain", writers)])
            ratio = median(results[("recorder", writers)]) / plain
            verdict = "met" if ratio >= goal else "NOT met"
            engine = median(results[("flowledger", writers)]) / plain
            console.print(
                f"issue 6 goal >= {goal}x of plain, flowledger recorder, {writers} writer(s): "
                f"{ratio:.2f}x, {verdict} (Engine.record_step: {engine:.2f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
