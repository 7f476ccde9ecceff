"""Where an assignment's time goes: timers around the calls that wait on PostgreSQL (the
agent locks, the append, the roster refresh, loads), and the statements sent, per task
assigned, with 8 threads on one engine or 8 engines of one thread each; with
``--processes N``, N spawned processes of one engine and one assigner each (as deployed):
each process's own CPU (``os.times``) and statements per task, and the CPU of the server
backends serving them (``/proc``, found by ``application_name``; a local server only).

Run: ``.venv/bin/python bench/profile_assignment.py [--engines 1|8 | --processes N] [--seconds 3]``
(``--cprofile DIR``: each process's assigning thread profiled by its own CPU time). Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards. The timers overlap (a
batch's append is inside its write): read each line on its own.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.engine.agent_claims import AgentClaims
from flowledger.infrastructure.engine.store import AggregateStore
from flowledger.infrastructure.engine.task_index import LogIndex
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.chain import StreamChain
from flowledger.infrastructure.postgres.database import drop_schema
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url

WRITERS = 8
TIMED: list[tuple[type, str]] = [
    (AgentLocks, "try_lock"),
    (AgentLocks, "lock"),
    (FlowledgerApplicationRecorder, "insert_events"),
    (LogIndex, "refresh"),
    (AggregateStore, "load"),
    (AggregateStore, "events"),
    (StreamChain, "seal"),
]
CPU_TIMED: list[tuple[type, str]] = [
    *TIMED,
    (AgentClaims, "lock_planned"),
    (AgentClaims, "choose"),
    (AggregateStore, "_save"),
    (AggregateStore, "write"),
]
"""Timed by the assigning thread's CPU time in each process (``--processes``)."""
seconds_in: Counter[str] = Counter()
calls: Counter[str] = Counter()
statements: Counter[str] = Counter()
_lock = threading.Lock()


def timed(cls: type, name: str, clock: Callable[[], float] = time.perf_counter) -> None:
    """Wrap ``cls.name`` so that its calls and time (wall time, or ``clock``'s) are counted."""
    original = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                seconds_in[label] += clock() - started
                calls[label] += 1

    setattr(cls, name, wrapper)


def count_statements() -> None:
    """Count every statement a cursor sends, by its first words (``Connection.execute`` uses one)."""
    original: Callable[..., Any] = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else repr(query)
        with _lock:
            statements[" ".join(text.split())[:60]] += 1
        return original(self, query, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]


def backend_cpu(url: str, application: str) -> dict[int, float]:
    """CPU seconds so far of each server backend whose ``application_name`` is ``application``
    (read from ``/proc``: the server must run on this machine)."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application,)
            )
        ]
    tick = os.sysconf("SC_CLK_TCK")
    spent = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        spent[pid] = (int(fields[11]) + int(fields[12])) / tick
    return spent


def process_assigner(
    settings: Settings,
    ids: list[str],
    n: int,
    seconds: float,
    start: Any,
    done: Any,
    results: Any,
    profile: str,
) -> None:
    """One engine and one assigner in a process of its own: its share of ``ids`` for ``seconds``;
    puts (assigned, process CPU s, statements, pipelines, appends, lost saves) on ``results``."""
    count_statements()
    for cls, name in CPU_TIMED:
        timed(cls, name, time.thread_time)
    engine = Engine(settings=settings.with_overrides(pool_size=2))
    try:
        engine.task_reads.index.refresh()
        statements.clear()
        seconds_in.clear()
        calls.clear()
        start.wait()
        profiler = cProfile.Profile(time.thread_time) if profile else None
        before, started, assigned = os.times(), time.perf_counter(), 0
        if profiler is not None:
            profiler.enable()
        for task_id in ids[n::WRITERS]:
            if time.perf_counter() - started >= seconds:
                break
            engine.assign_task(task_id)
            assigned += 1
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile, f"assign-{n}.prof"))
        after = os.times()
        cpu = after.user + after.system - before.user - before.system
        sent = sum(statements.values())
        counted = (dict(seconds_in), dict(calls), dict(statements))
        results.put((assigned, cpu, sent, engine.tasks.assigner.batches, engine.store.conflicts, *counted))
        done.wait()  # the parent reads the backends' CPU while they are still connected
    finally:
        engine.close()


def profile_processes(url: str, processes: int, seconds: float, tasks: int, profile: str) -> None:
    """``processes`` spawned processes assign one roster's tasks; print CPU and statements per task."""
    if profile:  # the processes write their profiles there; a missing folder failed them all
        os.makedirs(profile, exist_ok=True)
    schema = f"prof_{uuid.uuid4().hex[:10]}"
    application = schema  # how the server's backends of this run are found
    tagged = make_conninfo(url, application_name=application)
    settings = Settings(database_url=tagged, schema=schema, home=Path(tempfile.gettempdir()))
    try:
        with Engine(settings=settings.with_overrides(pool_size=2)) as setup:
            for n in range(5):
                setup.register_agent(f"agent-{n}", f"Agent {n}", ["python"], 10_000)
            ids = [f"task-{n:05d}" for n in range(tasks)]
            for task_id in ids:
                setup.create_task(task_id, "profiled task", ["python"])
        context = multiprocessing.get_context("spawn")
        start, done, results = context.Barrier(processes + 1), context.Barrier(processes + 1), context.Queue()
        workers = [
            context.Process(
                target=process_assigner, args=(settings, ids, n, seconds, start, done, results, profile)
            )
            for n in range(processes)
        ]
        for worker in workers:
            worker.start()
        start.wait()
        server_before = backend_cpu(url, application)
        rows = [results.get(timeout=120 + seconds) for _ in workers]
        server_after = backend_cpu(url, application)
        done.wait()
        for worker in workers:
            worker.join()
    finally:
        drop_schema(url, schema)
    assigned = sum(r[0] for r in rows)
    client = sum(r[1] for r in rows)
    server = sum(spent - server_before.get(pid, 0.0) for pid, spent in server_after.items())
    print(
        f"{processes} process(es), one engine and one assigner each: {assigned} assigned in "
        f"{seconds:.1f} s, {sum(r[3] for r in rows)} appends, {sum(r[4] for r in rows)} lost saves"
    )
    print(f"client CPU per task: {1000 * client / assigned:.2f} ms (the processes' own, summed)")
    print(f"server CPU per task: {1000 * server / assigned:.2f} ms (their backends', from /proc)")
    print(f"statements per task: {sum(r[2] for r in rows) / assigned:.2f}")
    for row in rows:
        seconds_in.update(row[5])
        calls.update(row[6])
        statements.update(row[7])
    print(f"{'call (assigning thread CPU)':45} {'calls/task':>10} {'ms/task':>8} {'ms/call':>8}")
    for label, spent in seconds_in.most_common():
        print(
            f"{label:45} {calls[label] / assigned:10.2f} {1000 * spent / assigned:8.2f} "
            f"{1000 * spent / calls[label]:8.2f}"
        )
    for text, count in statements.most_common(12):
        print(f"{count / assigned:8.2f}  {text}")


def main() -> None:
    """Set up agents and tasks, assign for a few seconds, print the counters per assignment."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", type=int, choices=(1, WRITERS), default=WRITERS)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tasks", type=int, default=1500)
    parser.add_argument("--processes", type=int, default=0, help="spawned processes instead of --engines")
    parser.add_argument("--cprofile", default="", help="with --processes: a folder for each one's profile")
    args = parser.parse_args()
    if args.processes:
        profile_processes(database_url(), args.processes, args.seconds, args.tasks, args.cprofile)
        return
    for cls, name in TIMED:
        timed(cls, name)
    count_statements()
    url, schema = database_url(), f"prof_{uuid.uuid4().hex[:10]}"
    settings = Settings(database_url=url, schema=schema, home=Path(tempfile.gettempdir()))
    engines = [Engine(settings=settings.with_overrides(pool_size=WRITERS))]
    try:
        for _ in range(args.engines - 1):
            engines.append(Engine(settings=settings.with_overrides(pool_size=2)))
        setup = engines[0]
        for n in range(5):
            setup.register_agent(f"agent-{n}", f"Agent {n}", ["python"], 10_000)
        ids = [f"task-{n:05d}" for n in range(args.tasks)]
        for task_id in ids:
            setup.create_task(task_id, "profiled task", ["python"])
        for engine in engines:
            engine.task_reads.index.refresh()
        seconds_in.clear()
        calls.clear()
        statements.clear()
        batches_before = sum(e.tasks.assigner.batches for e in engines)
        deadline = time.perf_counter() + args.seconds

        def assigner(n: int) -> int:
            engine, done = engines[n % len(engines)], 0
            for task_id in ids[n::WRITERS]:
                if time.perf_counter() >= deadline:
                    break
                engine.assign_task(task_id)
                done += 1
            return done

        started = time.perf_counter()
        with ThreadPoolExecutor(WRITERS) as pool:
            assigned = sum(pool.map(assigner, range(WRITERS)))
        elapsed = time.perf_counter() - started
        appends = sum(e.tasks.assigner.batches for e in engines) - batches_before
        lost = sum(e.store.conflicts for e in engines)
    finally:
        for engine in engines:
            engine.close()
        drop_schema(url, schema)
    print(
        f"{args.engines} engine(s), {WRITERS} threads: {assigned} assigned in {elapsed:.2f} s "
        f"({assigned / elapsed:.0f}/s), {appends} appends, {lost} lost saves"
    )
    print(f"{'call':45} {'calls/task':>10} {'ms/task':>8} {'ms/call':>8}")
    for label, spent in seconds_in.most_common():
        print(
            f"{label:45} {calls[label] / assigned:10.2f} {1000 * spent / assigned:8.2f} "
            f"{1000 * spent / calls[label]:8.2f}"
        )
    print(f"statements per task: {sum(statements.values()) / assigned:.2f}")
    for text, count in statements.most_common(10):
        print(f"{count / assigned:8.2f}  {text}")


if __name__ == "__main__":
    main()
