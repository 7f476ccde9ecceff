"""The audit chain's cost, side by side in one run:

- ``record_step`` with the chain on (each event's hash and keyed seal computed and stored
  with it) beside the chain off (``Settings.audit_chain=False``), 1 and 8 writers, rounds
  interleaved, medians printed with their ratio (goal: on / off >= 0.9);
- ``audit verify`` (every stream's chain recomputed and checked, against the latest signed
  checkpoint) in events/s, beside a raw read of the same rows (the same columns, in the
  same order, through the same driver, nothing computed).

Run: ``.venv/bin/python bench/bench_audit.py [--seconds 1.5] [--rounds 3] [--writers 1 8]
[--verify-events 20000]``. Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432
(db ``test``); works in scratch schemas that it drops.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from eventsourcing.persistence import StoredEvent
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    INPUT,
    OUTPUT,
    SESSION_STEPS,
    USAGE,
    database_url,
    engine_writers,
    median,
    run_writers,
    scratch_schema,
)

from flowledger.infrastructure import Engine, Settings

KEY_DIR = Path(tempfile.mkdtemp(prefix="flowledger-bench-keys-"))


def settings_for(url: str, schema: str, *, chain: bool, writers: int = 2) -> Settings:
    return Settings(home=Path("/nonexistent"), audit_key_dir=KEY_DIR).with_overrides(
        database_url=url,
        schema=schema,
        pool_size=max(writers, 2),
        audit_chain=chain,
        checkpoint_every_events=0,
        checkpoint_every_s=0,
    )


def step_rate(url: str, writers: int, seconds: float, *, chain: bool) -> tuple[float, float]:
    """``record_step`` per second, each writer on its own sessions (a new one every 25 steps),
    and this process's CPU microseconds per step (less sensitive to a shared machine)."""
    with scratch_schema(url, "bench_audit") as schema:
        engine = Engine(settings=settings_for(url, schema, chain=chain, writers=writers))
        try:
            cpu = time.process_time()
            rate = run_writers(writers, seconds, engine_writers(engine))
            cpu = time.process_time() - cpu
            return rate, cpu / max(rate * seconds, 1) * 1e6
        finally:
            engine.close()


def seal_micros(url: str, rounds: int) -> float:
    """CPU microseconds the chain adds to one append of a real StepProcessed event when its
    predecessor's hash is remembered (the common case): the hash and the seal."""
    from flowledger.verify import GENESIS, event_hash, event_mac

    with (
        scratch_schema(url, "bench_seal") as schema,
        Engine(settings=settings_for(url, schema, chain=True)) as engine,
    ):
        engine.start_session("sample", "customer_service")
        engine.record_step("sample", "answer", input=INPUT, output=OUTPUT, usage=USAGE)
        step = engine.log.stored(engine.session_uuid("sample"))[-1]
        key = engine.audit.chain_key
    name, n, samples = str(step.originator_id), 20_000, []
    for _ in range(rounds):
        started = time.process_time()
        for version in range(n):
            event_mac(key, name, version, event_hash(GENESIS, name, version, step.topic, step.state))
        samples.append((time.process_time() - started) / n * 1e6)
    return median(samples)


def verify_rates(url: str, events: int, rounds: int) -> tuple[float, float, int]:
    """(audit verify events/s, raw read events/s, events) over one log of about ``events`` events."""
    from flowledger.infrastructure.postgres.chain_verify import verify_chain

    with scratch_schema(url, "bench_verify") as schema:
        engine = Engine(settings=settings_for(url, schema, chain=True))
        try:
            # Real stored events (a session's Started and StepProcessed), appended a stream at a
            # time through the chained append path: the log fills in seconds, not minutes.
            engine.start_session("sample", "customer_service")
            engine.record_step("sample", "answer", input=INPUT, output=OUTPUT, usage=USAGE)
            started, step = engine.log.stored(engine.session_uuid("sample"))
            for _ in range(max(1, events // SESSION_STEPS)):
                stream = uuid.uuid4()
                engine.log.append_stored(
                    [StoredEvent(stream, 1, started.topic, started.state)]
                    + [StoredEvent(stream, v, step.topic, step.state) for v in range(2, SESSION_STEPS + 1)]
                )
            engine.audit.checkpoint()
            raw_query = (
                f"SELECT originator_id, originator_version, topic, state, notification_id, event_hash, "
                f"event_mac FROM {schema}.flowledger_events ORDER BY originator_id, originator_version"
            )
            verify_s: list[float] = []
            raw_s: list[float] = []
            stored = 0
            for _ in range(rounds):
                started = time.perf_counter()
                report = verify_chain(engine.audit)
                verify_s.append(time.perf_counter() - started)
                if not report.ok:
                    raise SystemExit(f"the bench log does not verify: {report.findings[:3]}")
                stored = report.events
                started = time.perf_counter()
                with psycopg.connect(url) as conn, conn.cursor(name="raw") as cur:
                    cur.itersize = 5000
                    cur.execute(raw_query)
                    count = sum(1 for _ in cur)
                raw_s.append(time.perf_counter() - started)
                assert count == stored
            return stored / median(verify_s), stored / median(raw_s), stored
        finally:
            engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per cell per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--verify-events", type=int, default=20_000, help="0: skip the verify part")
    args = parser.parse_args()
    url = database_url()
    console = Console(width=150)
    results: dict[tuple[bool, int], list[float]] = {}
    cpu: dict[tuple[bool, int], list[float]] = {}
    for round_no in range(args.rounds):
        for writers in args.writers:
            for chain in (True, False) if round_no % 2 == 0 else (False, True):
                rate, micros = step_rate(url, writers, args.seconds, chain=chain)
                results.setdefault((chain, writers), []).append(rate)
                cpu.setdefault((chain, writers), []).append(micros)
                label = "chain on " if chain else "chain off"
                console.print(
                    f"round {round_no + 1}: {writers:>2} writers {label} {rate:8,.0f} steps/s"
                    f" {micros:8,.0f} CPU us/step"
                )
    command = ("bench/bench_audit.py " + " ".join(sys.argv[1:])).strip()
    table = Table(title=f"Engine.record_step, one step per commit, steps/s (median)\n{command}")
    columns = (
        "writers",
        "chain on",
        "chain off",
        "on / off (goal >= 0.9)",
        "CPU us/step on",
        "CPU us/step off",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for writers in args.writers:
        on, off = median(results[(True, writers)]), median(results[(False, writers)])
        verdict = "met" if on / off >= 0.9 else "NOT met"
        table.add_row(
            str(writers),
            f"{on:,.0f}",
            f"{off:,.0f}",
            f"{on / off:.2f} ({verdict})",
            f"{median(cpu[(True, writers)]):,.0f}",
            f"{median(cpu[(False, writers)]):,.0f}",
        )
    console.print(table)
    off_cpu = median([c for w in args.writers for c in cpu[(False, w)]])
    sealing = seal_micros(url, args.rounds)
    console.print(
        f"the chain's own CPU per event (hash and seal, predecessor remembered): {sealing:.1f} us,"
        f" {sealing / off_cpu:.1%} of a record_step's CPU with the chain off ({off_cpu:,.0f} us)"
    )
    if args.verify_events <= 0:
        return 0
    verify, raw, events = verify_rates(url, args.verify_events, args.rounds)
    table = Table(title=f"audit verify beside a raw read of the same rows, events/s (median)\n{command}")
    for column in ("events", "audit verify", "raw read", "verify / raw"):
        table.add_column(column, justify="right")
    table.add_row(f"{events:,}", f"{verify:,.0f}", f"{raw:,.0f}", f"{verify / raw:.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
