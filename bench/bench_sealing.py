"""Sealed personal fields (AES-GCM per session, ``infrastructure/sealing.py``): on beside off.

- ``record_step``: ``Engine.record_step`` with sealing on and off, in the same run, slices
  alternating, each writer on its own session with a fresh one every 25 steps (as in
  ``bench_step_recording.py``; with sealing on, a start also writes the session's data key);
- encode + decode: the mapper alone on one ``StepProcessed`` event (no database), the CPU
  that sealing adds per event.

The issue's rule: sealing is on by default unless it costs more than 10 % of ``record_step``
(ratio on/off below 0.9); it did with 8 writers, so it is off by default (bench/README.md).
The two engines are built once and timed in alternating short slices, and the ratio is the
median of each pair's, so the shared machine's load drifts between pairs rather than
between the two sides. Run:
``.venv/bin/python bench/bench_sealing.py [--seconds 0.75] [--pairs 8] [--writers 1 8]``.
Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``); works in
scratch schemas that it drops.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import INPUT, OUTPUT, USAGE, database_url, median, run_writers, scratch_schema

from flowledger.domain import Session
from flowledger.infrastructure import Engine, Settings

SESSION_STEPS = 25


def engine_writers(engine: Engine) -> Callable[[int], Callable[[], None]]:
    def make(i: int) -> Callable[[], None]:
        current = [f"seal-{i}-{uuid.uuid4().hex}", 0]
        engine.start_session(str(current[0]), "customer_service", user_id=f"user-{i}")

        def step() -> None:
            if current[1] == SESSION_STEPS:
                current[:] = [f"seal-{i}-{uuid.uuid4().hex}", 0]
                engine.start_session(str(current[0]), "customer_service", user_id=f"user-{i}")
            engine.record_step(
                str(current[0]),
                "answer",
                input=INPUT,
                output=OUTPUT,
                context_update={"intent": "x"},
                usage=USAGE,
            )
            current[1] = int(current[1]) + 1

        return step

    return make


def mapper_us(seal: bool, repeats: int) -> float:
    """Microseconds to encode and decode one StepProcessed event."""
    with Engine(
        settings=Settings(home=Path("/nonexistent"), database_url="memory:", seal_personal_data=seal)
    ) as e:
        session = Session.start(
            session_id="s",
            tenant="default",
            workflow="cs",
            user_id="u",
            expires_at=datetime(2030, 1, 1, tzinfo=UTC),
            metadata={},
        )
        e.log.encode(session.collect_events()[0])  # makes the session's key (when sealing)
        session.record_step(step="answer", input=INPUT, output=OUTPUT, usage=USAGE)
        event = session.collect_events()[0]
        started = time.perf_counter()
        for _ in range(repeats):
            e.log.decode(e.log.encode(event))
        return (time.perf_counter() - started) / repeats * 1e6


def paired_rates(url: str, writers: int, seconds: float, pairs: int) -> tuple[list[float], list[float]]:
    """Steps/s with sealing on and off, in alternating slices on two engines built once
    (pairs of back-to-back slices, so the machine's load drifts between pairs, not within)."""
    on: list[float] = []
    off: list[float] = []
    with scratch_schema(url, "bench_seal") as s_on, scratch_schema(url, "bench_seal") as s_off:
        engines = {
            seal: Engine(
                settings=Settings(home=Path("/nonexistent")).with_overrides(
                    database_url=url, schema=schema, pool_size=max(writers, 2), seal_personal_data=seal
                )
            )
            for seal, schema in ((True, s_on), (False, s_off))
        }
        try:
            for pair in range(pairs):
                order = (True, False) if pair % 2 == 0 else (False, True)
                for seal in order:
                    rate = run_writers(writers, seconds, engine_writers(engines[seal]))
                    (on if seal else off).append(rate)
        finally:
            for engine in engines.values():
                engine.close()
    return on, off


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.75, help="timed seconds per slice")
    parser.add_argument("--pairs", type=int, default=8, help="on/off slice pairs per writer count")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=20_000, help="mapper round trips per round")
    args = parser.parse_args()
    url = database_url()
    table = Table(title=f"sealing personal fields: on beside off ({args.pairs} alternating pairs of slices)")
    for column in ("case", "sealing on", "sealing off", "on / off (median of pairs)"):
        table.add_column(column, justify="right" if column != "case" else "left")
    for writers in args.writers:
        on, off = paired_rates(url, writers, args.seconds, args.pairs)
        ratio = median([a / b for a, b in zip(on, off, strict=True)])
        table.add_row(
            f"record_step, {writers} writer(s), steps/s",
            f"{median(on):,.0f}",
            f"{median(off):,.0f}",
            f"{ratio:.2f}",
        )
    mapper = {seal: [mapper_us(seal, args.repeats // 4) for _ in range(4)] for seal in (True, False)}
    ratio = median([b / a for a, b in zip(mapper[True], mapper[False], strict=True)])
    on_us, off_us = median(mapper[True]), median(mapper[False])
    table.add_row(
        "encode + decode one step, µs (no database)", f"{on_us:.1f}", f"{off_us:.1f}", f"{ratio:.2f}"
    )
    Console().print(table)
    print("on / off: the share of sealing-off throughput kept with sealing on (goal >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
