"""Projection rebuild throughput beside a raw SELECT + decode of the same events, peak memory of
the rebuild, and append-to-visible latency while following.

Run: ``.venv/bin/python bench/bench_projections.py [--events 1000000]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards. The raw read and the rebuild
each run in a fresh process, so their peak RSS is their own.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import resource
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.projections import follow, projector_for, rebuild

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repository, for tests.support
from _common import database_url

from tests.support.synthetic import SessionScript, append

BATCH = 5000
STEPS = ("intent_classification", "skill_matching", "answer", "session_complete")
THREE = ("current_state", "cost", "funnel")
MODELS = ("deepseek-v3.2", "gpt-4.1", "gemini-2.5-flash", "claude-sonnet-4.5")


def engine_for(url: str, schema: str) -> Engine:
    """An engine on the bench schema that ignores the developer's other settings."""
    return Engine(settings=Settings(home=Path("/nonexistent"), database_url=url, schema=schema, pool_size=4))


def events(count: int, seed: int = 7) -> Iterator[Any]:
    """About ``count`` session events (sessions of 2-11 events), written session by session."""
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(days=2)
    made = n = 0
    while made < count:
        at = start + timedelta(seconds=n * 0.1)
        script = SessionScript(
            f"bench-{n}",
            f"workflow-{n % 3}",
            at,
            user_id=f"u{n % 97}",
            metadata={"channel": ("web", "app", "whatsapp")[n % 3]},
        )
        for step in STEPS:
            at += timedelta(seconds=rng.uniform(0.2, 20))
            model = rng.choice(MODELS)
            usage = LlmUsage(
                provider="bench",
                request_model=model,
                response_model=model,
                input_tokens=rng.randint(100, 4000),
                output_tokens=rng.randint(10, 900),
                cache_read_input_tokens=rng.randint(0, 100),
                cost_usd=Decimal(rng.randint(1, 90_000)) / 10**8,
                latency_ms=rng.lognormvariate(5.5, 0.6),
            )
            if rng.random() < 0.05:
                script.fail(step, at, rng.choice(("rate_limited", "timeout")), usage=usage)
                break
            script.step(
                step,
                at,
                usage=usage,
                context_update={step: rng.randint(0, 9)},
                input={"q": step},
                output={"a": "ok"},
            )
        ending = rng.random()
        if ending < 0.6:
            script.complete(at + timedelta(seconds=1))
        elif ending < 0.7:
            script.expire(at + timedelta(hours=1))
        yield from script.events[: count - made]
        made += min(len(script.events), count - made)
        n += 1


def raw_read(url: str, schema: str, out: Any) -> None:
    """Child process: SELECT every notification in batches and decode each event."""
    engine = engine_for(url, schema)
    recorder, mapper = engine.log.recorder, engine.log.mapper
    began, position, decoded = time.perf_counter(), 0, 0
    while True:
        batch = recorder.select_notifications(start=position + 1, limit=BATCH)
        if not batch:
            break
        decoded += len([mapper.to_domain_event(n) for n in batch])
        position = batch[-1].id
    out.put((decoded, time.perf_counter() - began, peak_rss_mb(), []))
    engine.close()


def rebuild_three(url: str, schema: str, out: Any) -> None:
    """Child process: rebuild current state, cost dashboard and funnel."""
    rebuild_some(url, schema, out, THREE)


def rebuild_four(url: str, schema: str, out: Any) -> None:
    """Child process: rebuild those three and the seed-compatible tables."""
    rebuild_some(url, schema, out, (*THREE, "seed"))


def rebuild_some(url: str, schema: str, out: Any, names: tuple[str, ...]) -> None:
    """Rebuild ``names`` from the first event, reporting time and peak RSS (sampled at quarters)."""
    engine = engine_for(url, schema)
    projector = projector_for(engine, batch_size=BATCH)
    head = engine.log.head() or 1
    quarters: list[float] = []

    def progress(position: int) -> None:
        if position >= head * (len(quarters) + 1) / 4:
            quarters.append(peak_rss_mb())

    began = time.perf_counter()
    rebuild(projector, list(names), progress=progress)
    out.put((head, time.perf_counter() - began, peak_rss_mb(), quarters))
    engine.close()


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_child(target: Any, url: str, schema: str) -> tuple[int, float, float, list[float]]:
    """Run ``target`` in a fresh process and return what it reports."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(url, schema, queue))
    process.start()
    result = queue.get()
    process.join()
    return result  # type: ignore[no-any-return]


def follow_latency(url: str, schema: str, samples: int) -> tuple[list[float], list[float]]:
    """Append one event at a time while a follower runs; time until the reader view shows it."""
    engine = engine_for(url, schema)
    projector = projector_for(engine)
    stop, ready = threading.Event(), threading.Event()
    follower = threading.Thread(target=follow, args=(projector,), kwargs={"stop": stop, "ready": ready})
    follower.start()
    ready.wait(120)
    from_call, from_commit = [], []
    query = sql.SQL("SELECT 1 FROM {}.sessions WHERE tenant = 'default' AND session_id = %s").format(
        sql.Identifier(projector.names.reader)
    )
    with psycopg.connect(url, autocommit=True) as reader:
        for n in range(samples):
            session_id = f"live-{n}"
            called = time.perf_counter()
            engine.start_session(session_id, "live")
            committed = time.perf_counter()
            while reader.execute(query, [session_id]).fetchone() is None:
                time.sleep(0.0002)
            seen = time.perf_counter()
            from_call.append((seen - called) * 1000)
            from_commit.append((seen - committed) * 1000)
            time.sleep(0.01)
    stop.set()
    follower.join()
    engine.close()
    return from_call, from_commit


def percentile(values: list[float], q: float) -> float:
    """Exact percentile with linear interpolation (as percentile_cont)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def main() -> None:
    """Generate, measure, print, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=300, help="follow-latency samples")
    parser.add_argument(
        "--include-seed",
        action="store_true",
        help="also rebuild with the seed-compatible tables (a fourth projection)",
    )
    args = parser.parse_args()
    console = Console()
    url, schema = database_url(), f"bench_proj_{uuid.uuid4().hex[:8]}"
    engine = engine_for(url, schema)
    try:
        began = time.perf_counter()
        stored = append(engine.log, events(args.events), per_transaction=BATCH)
        console.print(f"generated {stored:,} events in {time.perf_counter() - began:.1f} s")
        raw = in_child(raw_read, url, schema)
        built = {"rebuild: current state, cost, funnel": in_child(rebuild_three, url, schema)}
        if args.include_seed:
            built["rebuild: the three + seed tables"] = in_child(rebuild_four, url, schema)
        from_call, from_commit = follow_latency(url, schema, args.samples)
        report(console, raw, built, from_call, from_commit)
    finally:
        engine.close()
        with psycopg.connect(url, autocommit=True) as conn:
            for (name,) in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = %s OR starts_with(nspname, %s)",
                [schema, schema + "_"],
            ):
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def report(
    console: Console,
    raw: tuple[int, float, float, list[float]],
    built: dict[str, tuple[int, float, float, list[float]]],
    from_call: list[float],
    from_commit: list[float],
) -> None:
    """Print the side-by-side tables."""
    raw_rate = raw[0] / raw[1]
    table = Table(title=f"projections: {raw[0]:,} events, batches of {BATCH}")
    for column in ("case", "seconds", "events/s", "ratio", "peak RSS MiB", "goal"):
        table.add_column(column, justify="left" if column in ("case", "goal") else "right")
    table.add_row("raw SELECT + decode", f"{raw[1]:.1f}", f"{raw_rate:,.0f}", "1.00", f"{raw[2]:.0f}", "")
    for label, (_, seconds, peak, _) in built.items():
        rate = raw[0] / seconds
        table.add_row(
            label, f"{seconds:.1f}", f"{rate:,.0f}", f"{rate / raw_rate:.2f}", f"{peak:.0f}", ">= 0.30"
        )
    console.print(table)
    for label, (*_, quarters) in built.items():
        console.print(
            f"{label}: peak RSS at 1/4, 2/4, 3/4, 4/4 of the log: "
            + ", ".join(f"{mb:.0f}" for mb in quarters)
            + " MiB"
        )
    latency = Table(title=f"append-to-visible while following ({len(from_call)} appends)")
    for column in ("measured from", "p50 ms", "p99 ms", "mean ms", "goal"):
        latency.add_column(column, justify="left" if column in ("measured from", "goal") else "right")
    for label, values, goal in (
        ("commit of the append", from_commit, "p99 <= 100 ms"),
        ("start of the append call", from_call, ""),
    ):
        latency.add_row(
            label,
            f"{percentile(values, 0.5):.1f}",
            f"{percentile(values, 0.99):.1f}",
            f"{statistics.fmean(values):.1f}",
            goal,
        )
    console.print(latency)


if __name__ == "__main__":
    main()
