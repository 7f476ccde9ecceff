"""What the statement watchdog costs the hot path (``infrastructure/postgres/watchdog.py``).

Every connection the pool lends inside an operation is armed with the operation's end and
disarmed when it comes back. Two measures, each the calling thread's CPU, alternating the two
ways ``--rounds`` times, medians:

- a pool checkout and return (no statement), outside an operation (not armed) and inside one;
- ``record_step`` on one session, one writer, with arming as shipped and switched off
  (``WATCHDOG.arm`` replaced by a no-op for the slice): the difference is within the noise
  of a step's few hundred µs unless the machine is quiet.

Run: ``.venv/bin/python bench/bench_statement_watchdog.py [--calls 4000] [--rounds 6]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``); works in a scratch
schema that it drops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url, scratch_schema
from bench_step_recording import engine_on

from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.postgres.deadlines import ReconnectingPool
from flowledger.infrastructure.postgres.watchdog import WATCHDOG


def per_call_us(call: Callable[[], object], calls: int) -> float:
    """The calling thread's CPU per call, in µs."""
    started = time.thread_time()
    for _ in range(calls):
        call()
    return (time.thread_time() - started) / calls * 1e6


def checkouts(url: str, calls: int, rounds: int) -> tuple[float, float]:
    """µs per checkout and return: (not armed, armed)."""
    pool = ReconnectingPool(url, min_size=1, max_size=1, open=True)
    pool.wait()
    ways: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(rounds):
            for armed in (False, True):
                scope: AbstractContextManager[object] = operation_deadline(600) if armed else nullcontext()
                with scope:
                    ways[armed].append(per_call_us(lambda: pool.putconn(pool.getconn()), calls * 10))
    finally:
        pool.close()
    return statistics.median(ways[False]), statistics.median(ways[True])


def steps(url: str, calls: int, rounds: int) -> tuple[float, float]:
    """µs of CPU per ``record_step``: (arming switched off, as shipped)."""
    ways: dict[bool, list[float]] = {False: [], True: []}
    with scratch_schema(url, "bench_watchdog") as schema, engine_on(url, schema, 1, None) as engine:
        engine.start_session("s", "wf")
        for _ in range(500):
            engine.record_step("s", "warm")
        for _ in range(rounds):
            for armed in (False, True):
                if not armed:
                    WATCHDOG.arm = lambda conn, end: None  # type: ignore[method-assign]
                try:
                    ways[armed].append(per_call_us(lambda: engine.record_step("s", "step"), calls))
                finally:
                    if not armed:
                        del WATCHDOG.arm
    return statistics.median(ways[False]), statistics.median(ways[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    url = database_url()
    table = Table(title="statement watchdog: thread CPU, µs (medians)")
    for column in ("call", "not armed", "armed", "difference"):
        table.add_column(column, justify="right" if column != "call" else "left")
    for name, (off, on) in (
        ("pool checkout and return", checkouts(url, args.calls, args.rounds)),
        ("record_step, one writer", steps(url, args.calls, args.rounds)),
    ):
        table.add_row(name, f"{off:.2f}", f"{on:.2f}", f"{on - off:+.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
