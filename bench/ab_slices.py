"""Engine.record_step of several trees (worktrees) and the plain insert, in interleaved slices.

Each case is a worker process that builds its engine (or plain-insert connections) once and
then runs ``--writers`` writers for one slice whenever the driver says so; the driver runs
the cases in turn (the order reversed every other slice) and prints each case's median and
the median of its per-slice ratios to the plain insert. Slow drifts of a shared machine's
load hit every case alike, and no engine start falls inside a slice (unlike
``bench_step_recording.py``, which builds an engine per cell).

A case is ``label=WORKTREE[:engine|plain[:PATCHES]]``; WORKTREE is a directory with its own
``.venv`` (``git worktree add``, ``make install``); PATCHES (``+``-separated) switch parts off
in that engine, to see what they cost: ``nochain`` (the audit chain), ``utc`` (the host's
clock instead of the database's), ``nobudgets`` (the budget check). Run::

    .venv/bin/python bench/ab_slices.py --slices 16 old=/work/wt-old new=. \\
        nochain=.:engine:nochain plain=.:plain

Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def worker(case: str, writers: int, patches: set[str]) -> None:
    """Serve slices: read ``go SECONDS`` lines, answer each with the rate of one slice."""
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import _common
    import bench_step_recording as bench  # the worktree's own bench
    from _common import database_url, run_writers, scratch_schema

    # Older trees kept the Engine writers in bench_step_recording.py.
    engine_writers = getattr(_common, "engine_writers", None) or bench.engine_writers

    url = database_url()
    with scratch_schema(url, "ab_slices") as schema:
        conns: list[Any] = []
        if case == "engine":
            context = bench.engine_on(url, schema, writers, None)
            engine = context.__enter__()
            if "nochain" in patches:
                engine.log.recorder.chain = None  # type: ignore[attr-defined]
            if "utc" in patches:
                from flowledger.infrastructure.engine.clock import utc_now

                engine.store.clock = utc_now
            if "nobudgets" in patches:
                engine.budgets._ledger = None
            make = engine_writers(engine)
        else:
            with scratch_schema(url, "ab_sample") as sample:
                row = bench.sample_row(url, sample)
            make = bench.plain_writers(url, schema, row, conns)
        run_writers(writers, 0.5, make)  # warm: pools, prepared statements
        print("ready", flush=True)
        for line in sys.stdin:
            print(f"{run_writers(writers, float(line.split()[1]), make):.1f}", flush=True)
            for conn in conns:  # plain: each slice's writers open their own connections
                conn.close()
            conns.clear()
        if case == "engine":
            context.__exit__(None, None, None)


def drive(slices: int, seconds: float, writers: int, specs: list[str]) -> None:
    """Start one worker per case, run the slices in turn, print medians and ratios."""
    workers: dict[str, subprocess.Popen[str]] = {}
    for spec in specs:
        label, _, rest = spec.partition("=")
        tree, case, patches = ([*rest.split(":"), "", ""])[:3]
        root = Path(tree).resolve()
        workers[label] = subprocess.Popen(
            [
                str(root / ".venv/bin/python"),
                __file__,
                "--worker",
                case or "engine",
                "--writers",
                str(writers),
            ],
            cwd=root,
            env={**os.environ, "AB_PATCHES": patches},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    rates: dict[str, list[float]] = {label: [] for label in workers}
    for label, process in workers.items():
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"worker {label} did not start")
    order = list(workers)
    for n in range(slices):
        for label in order if n % 2 == 0 else order[::-1]:
            process = workers[label]
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.write(f"go {seconds}\n")
            process.stdin.flush()
            rates[label].append(float(process.stdout.readline()))
    for process in workers.values():
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    plain = rates.get("plain")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{writers} writers, {slices} slices of {seconds} s per case, load average {load}")
    for label, values in rates.items():
        ratio = ""
        if plain is not None and label != "plain":
            ratio = (
                f"  ratio to plain {statistics.median(a / p for a, p in zip(values, plain, strict=True)):.2f}"
            )
        print(f"{label:10s} median {statistics.median(values):8,.0f} steps/s{ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="label=WORKTREE[:engine|plain[:PATCHES]]")
    parser.add_argument("--slices", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.writers, set(filter(None, os.environ.get("AB_PATCHES", "").split("+"))))
    else:
        drive(args.slices, args.seconds, args.writers, args.cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
