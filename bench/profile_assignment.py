"""Where an assignment's time goes: timers around the calls that wait on PostgreSQL (the
agent locks, the append, the roster refresh, loads), and the statements sent, per task
assigned, with 8 threads on one engine or 8 engines of one thread each.

Run: ``.venv/bin/python bench/profile_assignment.py [--engines 1|8] [--seconds 3]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards. The timers overlap (a
batch's append is inside its write): read each line on its own.
"""

from __future__ import annotations

import argparse
import functools
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

from flowledger.infrastructure import Engine, Settings
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
seconds_in: Counter[str] = Counter()
calls: Counter[str] = Counter()
statements: Counter[str] = Counter()
_lock = threading.Lock()


def timed(cls: type, name: str) -> None:
    """Wrap ``cls.name`` so that its calls and wall time are counted."""
    original = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                seconds_in[label] += time.perf_counter() - started
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


def main() -> None:
    """Set up agents and tasks, assign for a few seconds, print the counters per assignment."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", type=int, choices=(1, WRITERS), default=WRITERS)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tasks", type=int, default=1500)
    args = parser.parse_args()
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
