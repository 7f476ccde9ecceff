"""Tasks assigned per second by 8 concurrent assigners on PostgreSQL, beside the durable
step-recording limit (``engine.record_step`` with 8 writers) measured in the same run.

Run: ``.venv/bin/python bench/bench_assignment.py [--seconds 3]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventsourcing.persistence import IntegrityError
from rich.console import Console
from rich.table import Table

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url

WRITERS = 8
AGENTS = 5


@dataclass
class Result:
    """One measured case."""

    case: str
    setup: str
    ops: int
    seconds: float
    conflicts: int = 0

    @property
    def rate(self) -> float:
        """Operations per second."""
        return self.ops / self.seconds


def run_for(seconds: float, workers: list[Callable[[Callable[[], bool]], int]]) -> tuple[int, float]:
    """Run each worker on its own thread until ``seconds`` pass; returns (ops, elapsed)."""
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    with ThreadPoolExecutor(len(workers)) as pool:
        done = list(pool.map(lambda work: work(lambda: time.perf_counter() < deadline), workers))
    return sum(done), time.perf_counter() - started


def count_conflicts(engine: Engine) -> list[int]:
    """Wrap the engine's saves to count the writes it lost to another writer."""
    counter, lock, save = [0], threading.Lock(), engine.app.save

    def counting(*aggregates: Any, **kwargs: Any) -> Any:
        try:
            return save(*aggregates, **kwargs)
        except IntegrityError:
            with lock:
                counter[0] += 1
            raise

    engine.app.save = counting  # type: ignore[method-assign]
    return counter


def bench_record_step(engines: list[Engine], seconds: float) -> Result:
    """8 writers, each recording steps on its own session."""

    def writer(n: int) -> Callable[[Callable[[], bool]], int]:
        def work(running: Callable[[], bool]) -> int:
            engine, session = engines[n % len(engines)], f"bench-{n}"
            engine.start_session(session, "bench")
            count = 0
            while running():
                engine.record_step(session, "step", input={"n": count}, output={"ok": True})
                count += 1
            return count

        return work

    ops, elapsed = run_for(seconds, [writer(n) for n in range(WRITERS)])
    return Result("record_step (durable steps)", f"{WRITERS} threads", ops, elapsed)


def bench_assign(engines: list[Engine], seconds: float, label: str, tasks: int) -> Result:
    """8 assigners, each assigning its own share of pre-created tasks to 5 agents."""
    setup = engines[0]
    prefix = uuid.uuid4().hex[:6]
    for n in range(AGENTS):
        setup.register_agent(f"{prefix}-agent-{n}", f"Agent {n}", ["python", "sql"], 10_000)
    ids = [f"{prefix}-task-{n:05d}" for n in range(tasks)]
    for task_id in ids:
        setup.create_task(task_id, "benchmark task", ["python"], "medium")
    for engine in engines:  # a long-running process catches up with the log once, not per call
        engine.log_index.refresh()
    counters = [count_conflicts(engine) for engine in engines]

    def assigner(n: int) -> Callable[[Callable[[], bool]], int]:
        def work(running: Callable[[], bool]) -> int:
            engine, count = engines[n % len(engines)], 0
            for task_id in ids[n::WRITERS]:
                if not running():
                    break
                engine.assign_task(task_id)
                count += 1
            return count

        return work

    ops, elapsed = run_for(seconds, [assigner(n) for n in range(WRITERS)])
    if ops == tasks:
        print(f"warning: {label} ran out of tasks; raise --tasks")
    return Result("assign_task", label, ops, elapsed, sum(c[0] for c in counters))


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each case")
    parser.add_argument("--tasks", type=int, default=3000, help="tasks created per assign case")
    args = parser.parse_args()
    url, schema = database_url(), f"bench_{uuid.uuid4().hex[:10]}"
    settings = Settings(database_url=url, schema=schema, home=Path(tempfile.gettempdir()))
    # Small pools: eight engines at the default 20 connections would exhaust the server.
    one = Engine(settings=settings.with_overrides(pool_size=WRITERS))
    many = [one] + [Engine(settings=settings.with_overrides(pool_size=2)) for _ in range(WRITERS - 1)]
    try:
        steps = bench_record_step([one], args.seconds)
        results = [
            steps,
            bench_assign([one], args.seconds, f"{WRITERS} threads, one engine", args.tasks),
            bench_assign(many, args.seconds, f"{WRITERS} engines (like processes)", args.tasks),
        ]
    finally:
        for engine in many:
            engine.close()
        drop_schema(url, schema)
    table = Table(title=f"task assignment vs durable step recording ({WRITERS} writers, PostgreSQL)")
    for column in (
        "case",
        "writers",
        "ops",
        "seconds",
        "per second",
        "vs record_step",
        "lost writes retried",
    ):
        table.add_column(column, justify="left" if column in ("case", "writers") else "right")
    for r in results:
        table.add_row(
            r.case,
            r.setup,
            f"{r.ops:,}",
            f"{r.seconds:.2f}",
            f"{r.rate:,.0f}",
            f"{r.rate / steps.rate:.2f}x",
            f"{r.conflicts:,}",
        )
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
