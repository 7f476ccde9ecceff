"""Client CPU of an append: one event through psycopg's cursor or libpq's prepared call;
several events with their arrays dumped by psycopg or encoded in binary by hand.

The recorder sends a one-event append through ``PreparedAppend`` (``PGconn.exec_prepared``,
``infrastructure/postgres/prepared_append.py``); with it switched off the same recorder sends
the same statement through psycopg's cursor. This bench appends ``--calls`` one-event
appends each way on one engine's recorder (one writer, so the CPU is the call's, not the
GIL's queue), alternating ``--rounds`` times, and prints the process's CPU per append and the
appends per second, median over rounds. Then ``record_step`` itself both ways (8 writers, one
engine built once, alternating slices), the case the change was made for.

Second table: appends of several events (2: one assignment, a task and its agent; 16: a
batch of eight), the six arrays as Python lists through psycopg's list dumper
(``recorder.encode_arrays = None``) or encoded by ``binary_arrays.py``, ``--calls`` / 4 appends
per round and way, alternating the same way.

Run: ``.venv/bin/python bench/bench_append_call.py [--calls 3000] [--rounds 5]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``); works in a scratch
schema that it drops.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

from eventsourcing.persistence import StoredEvent
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url, engine_writers, run_writers, scratch_schema
from bench_step_recording import engine_on, sample_row

from flowledger.infrastructure import Engine


def cpu_s() -> float:
    """This process's CPU seconds (user + system, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def appends(engine: Engine, row: tuple[str, bytes], calls: int) -> tuple[float, float]:
    """(µs of CPU per append, appends per second) of ``calls`` one-event appends on a new stream."""
    recorder, stream = engine.log.recorder, uuid.uuid4()
    cpu, wall = cpu_s(), time.perf_counter()
    for version in range(1, calls + 1):
        recorder.insert_events([StoredEvent(stream, version, row[0], row[1])])
    return (cpu_s() - cpu) / calls * 1e6, calls / (time.perf_counter() - wall)


def several(engine: Engine, row: tuple[str, bytes], events: int, calls: int) -> tuple[float, float]:
    """(µs of CPU per append, appends per second) of ``calls`` appends of ``events`` events each
    (one per stream, ``events`` new streams)."""
    recorder, streams = engine.log.recorder, [uuid.uuid4() for _ in range(events)]
    cpu, wall = cpu_s(), time.perf_counter()
    for version in range(1, calls + 1):
        recorder.insert_events([StoredEvent(stream, version, row[0], row[1]) for stream in streams])
    return (cpu_s() - cpu) / calls * 1e6, calls / (time.perf_counter() - wall)


def alternating(each: int, ways: tuple[str, str] = ("prepared", "cursor")) -> list[str]:
    """Both ways ``each`` times, in the order a b b a a b ... (neither always goes first)."""
    return [ways[(n + n // 2) % 2] for n in range(each * 2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="appends per round and way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slices", type=int, default=8, help="record_step slices per way")
    args = parser.parse_args()
    url = database_url()
    results: dict[str, list[tuple[float, float]]] = {"cursor": [], "prepared": []}
    steps: dict[str, list[float]] = {"cursor": [], "prepared": []}
    with scratch_schema(url, "bench_call") as schema:
        row = sample_row(url, schema)
    with scratch_schema(url, "bench_call") as schema, engine_on(url, schema, 8, None) as engine:
        recorder = engine.log.recorder
        prepared = recorder.prepared_one
        appends(engine, row, 200)  # connections open, statements prepared, both ways
        for way in alternating(args.rounds):
            recorder.prepared_one = prepared if way == "prepared" else None
            results[way].append(appends(engine, row, args.calls))
        for way in alternating(args.slices):
            recorder.prepared_one = prepared if way == "prepared" else None
            steps[way].append(run_writers(8, 1.0, engine_writers(engine)))
        recorder.prepared_one = prepared
        encode = recorder.encode_arrays
        batches: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for events in (2, 16):
            several(engine, row, events, 50)  # statements prepared both ways
            for way in alternating(args.rounds, ("binary", "lists")):
                recorder.encode_arrays = encode if way == "binary" else None
                batches.setdefault((events, way), []).append(several(engine, row, events, args.calls // 4))
        recorder.encode_arrays = encode
    table = Table(title=f"one-event append, one writer, {args.calls:,} calls x {args.rounds} rounds (median)")
    for column in ("sent through", "CPU µs per append", "appends/s", "record_step, 8 writers, steps/s"):
        table.add_column(column, justify="right" if column != "sent through" else "left")
    for way, label in (("cursor", "psycopg Cursor.execute"), ("prepared", "PGconn.exec_prepared")):
        table.add_row(
            label,
            f"{statistics.median(c for c, _ in results[way]):.0f}",
            f"{statistics.median(r for _, r in results[way]):,.0f}",
            f"{statistics.median(steps[way]):,.0f}",
        )
    console = Console(width=120)
    console.print(table)
    calls = f"{args.calls // 4:,} calls x {args.rounds} rounds"
    many = Table(title=f"several-event appends, one writer, {calls} (median)")
    for column in ("events per append", "arrays sent as", "CPU µs per append", "appends/s"):
        many.add_column(column, justify="right" if column != "arrays sent as" else "left")
    for (events, way), measured in sorted(batches.items()):
        many.add_row(
            str(events),
            "binary, built by hand" if way == "binary" else "Python lists, psycopg's dumper",
            f"{statistics.median(c for c, _ in measured):.0f}",
            f"{statistics.median(r for _, r in measured):,.0f}",
        )
    console.print(many)
    return 0


if __name__ == "__main__":
    sys.exit(main())
