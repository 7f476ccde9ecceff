"""Tasks assigned per second by 8 concurrent assigners on PostgreSQL, beside the durable
step-recording limit (``engine.record_step`` with 8 writers) measured in the same run, the
saves lost to another writer, the appends made (an engine decides concurrent assignments
in batches), and the seed's claimed 787 tasks/s. The 8 assigners run as 8 threads of one
engine, as 8 engines in this process (sharing its interpreter lock), and as 8 processes of
one engine each (spawned; how engines are deployed). Every agent's load is checked against
its capacity and the assignments made after each case.

Run: ``.venv/bin/python bench/bench_assignment.py [--seconds 3]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url

WRITERS = 8
AGENTS = 5
SEED_CLAIM = 787
"""Tasks per second the seed article reports (in-memory agents, nothing durable)."""


@dataclass
class Result:
    """One measured case."""

    case: str
    setup: str
    ops: int
    seconds: float
    conflicts: int = 0
    appends: int | None = None

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


def check_capacity(engine: Engine, prefix: str, assigned: int, label: str) -> None:
    """Fail loudly if an agent holds more than its capacity, or the loads miss an assignment."""
    agents = [a for a in engine.list_agents() if a.agent_id.startswith(prefix)]
    over = [a.agent_id for a in agents if a.load > a.capacity]
    held = sum(a.load for a in agents)
    if over or held != assigned:
        raise SystemExit(f"{label}: capacity broken: over {over}; agents hold {held}, {assigned} assigned")


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


def roster_and_tasks(setup: Engine, tasks: int) -> tuple[str, list[str]]:
    """5 agents and ``tasks`` pending tasks of a case's own (a fresh prefix and skill)."""
    prefix = uuid.uuid4().hex[:6]
    for n in range(AGENTS):
        # A skill of this case's own: tasks never go to an earlier case's agents.
        setup.register_agent(f"{prefix}-agent-{n}", f"Agent {n}", [f"python-{prefix}", "sql"], 10_000)
    ids = [f"{prefix}-task-{n:05d}" for n in range(tasks)]
    for task_id in ids:
        setup.create_task(task_id, "benchmark task", [f"python-{prefix}"], "medium")
    return prefix, ids


def assign_share(engine: Engine, ids: list[str], n: int, running: Callable[[], bool]) -> int:
    """Assigner ``n``'s share of ``ids`` (every WRITERS-th), while ``running()``; how many were assigned."""
    count = 0
    for task_id in ids[n::WRITERS]:
        if not running():
            break
        if engine.assign_task(task_id).status is TaskStatus.ASSIGNED:
            count += 1
    return count


def process_assigner(
    settings: Settings, ids: list[str], n: int, seconds: float, start: Any, results: Any
) -> None:
    """One engine in a process of its own: assign its share of ``ids`` for ``seconds`` once
    every process is ready; put (assigned, seconds, lost saves, appends) on ``results``."""
    engine = Engine(settings=settings.with_overrides(pool_size=2))
    try:
        engine.task_reads.index.refresh()
        start.wait()
        started = time.perf_counter()
        count = assign_share(engine, ids, n, lambda: time.perf_counter() - started < seconds)
        elapsed = time.perf_counter() - started
        results.put((count, elapsed, engine.store.conflicts, engine.tasks.assigner.batches))
    finally:
        engine.close()


def bench_assign_processes(settings: Settings, seconds: float, tasks: int) -> Result:
    """8 processes, one engine and one assigner each (how engines are deployed), on one roster."""
    label = f"{WRITERS} processes, one engine each"
    with Engine(settings=settings.with_overrides(pool_size=2)) as setup:
        prefix, ids = roster_and_tasks(setup, tasks)
        context = multiprocessing.get_context("spawn")
        start, results = context.Barrier(WRITERS), context.Queue()
        workers = [
            context.Process(target=process_assigner, args=(settings, ids, n, seconds, start, results))
            for n in range(WRITERS)
        ]
        for worker in workers:
            worker.start()
        done = [results.get(timeout=120 + seconds) for _ in workers]
        for worker in workers:
            worker.join()
        ops = sum(d[0] for d in done)
        if ops == tasks:
            print(f"warning: {label} ran out of tasks; raise --tasks")
        check_capacity(setup, prefix, ops, label)
    return Result(
        "assign_task", label, ops, max(d[1] for d in done), sum(d[2] for d in done), sum(d[3] for d in done)
    )


def bench_assign(engines: list[Engine], seconds: float, label: str, tasks: int) -> Result:
    """8 assigners, each assigning its own share of pre-created tasks to 5 agents."""
    setup = engines[0]
    prefix, ids = roster_and_tasks(setup, tasks)
    for engine in engines:  # a long-running process catches up with the log once, not per call
        engine.task_reads.index.refresh()
    lost_before = sum(engine.store.conflicts for engine in engines)
    batches_before = sum(engine.tasks.assigner.batches for engine in engines)

    def assigner(n: int) -> Callable[[Callable[[], bool]], int]:
        def work(running: Callable[[], bool]) -> int:
            return assign_share(engines[n % len(engines)], ids, n, running)

        return work

    ops, elapsed = run_for(seconds, [assigner(n) for n in range(WRITERS)])
    if ops == tasks:
        print(f"warning: {label} ran out of tasks; raise --tasks")
    lost = sum(engine.store.conflicts for engine in engines) - lost_before
    batches = sum(engine.tasks.assigner.batches for engine in engines) - batches_before
    check_capacity(setup, prefix, ops, label)
    return Result("assign_task", label, ops, elapsed, lost, batches)


def with_engines(
    settings: Settings, count: int, run: Callable[[list[Engine]], Result], **overrides: bool
) -> Result:
    """Run one case on ``count`` engines over one schema, closed afterwards: the first with a
    connection per writer, the others with small pools (eight engines at the default 20
    connections each would exhaust a server shared with other work)."""
    engines = [Engine(settings=settings.with_overrides(pool_size=WRITERS, **overrides))]
    try:
        for _ in range(count - 1):
            engines.append(Engine(settings=settings.with_overrides(pool_size=2, **overrides)))
        return run(engines)
    finally:
        for engine in engines:
            engine.close()


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each case")
    parser.add_argument(
        "--tasks",
        type=int,
        default=8000,
        help="tasks created per assign case: enough that one engine does not run out in 3 s "
        "(3,000 ran out in 1.5 s), and fewer than an engine caches (Settings.write_cache_size, "
        "10,000): past it, the assigners, taking tasks in the order they were made, each miss "
        "the cache and evict the next task they will want (at 10,000 tasks one engine made "
        "1,330/s against 1,976/s at 5,000)",
    )
    parser.add_argument(
        "--write-cache-size",
        type=int,
        default=Settings.write_cache_size,
        help="aggregates each engine keeps in memory (Settings.write_cache_size); tasks past it "
        "are loaded from the log when assigned",
    )
    args = parser.parse_args()
    url, schema = database_url(), f"bench_{uuid.uuid4().hex[:10]}"
    settings = Settings(
        database_url=url,
        schema=schema,
        home=Path(tempfile.gettempdir()),
        write_cache_size=args.write_cache_size,
    )
    try:
        steps = with_engines(settings, 1, lambda engines: bench_record_step(engines, args.seconds))
        results = [
            steps,
            with_engines(
                settings,
                1,
                lambda engines: bench_assign(
                    engines, args.seconds, f"{WRITERS} threads, one engine", args.tasks
                ),
            ),
            with_engines(
                settings,
                WRITERS,
                lambda engines: bench_assign(
                    engines, args.seconds, f"{WRITERS} engines (like processes)", args.tasks
                ),
            ),
            with_engines(
                settings,
                WRITERS,
                lambda engines: bench_assign(
                    engines, args.seconds, f"{WRITERS} engines, no agent locks", args.tasks
                ),
                agent_locks=False,
            ),
            bench_assign_processes(settings, args.seconds, args.tasks),
        ]
    finally:
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
        "appends",
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
            f"{r.appends:,}" if r.appends is not None else "",
        )
    console = Console(width=160)
    console.print(table)
    best = max(r.rate for r in results[1:])
    console.print(
        f"the seed's claim: {SEED_CLAIM} tasks/s (agents in a Python list, nothing durable); "
        f"here, durable and capacity-checked: {best:,.0f}/s ({best / SEED_CLAIM:.2f}x the claim)"
    )


if __name__ == "__main__":
    main()
