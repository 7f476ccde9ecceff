"""Retention (issue 17 item 5, docs/retention.md): archiving closed sessions to verified bundles.

Writes ``--sessions`` sessions of ``--steps`` model steps each (started, steps, completed)
with the engine's clock 100 days back, brings the projections up to date, sets a 90-day
policy, then times, on the real clock:

- ``retention run --dry-run`` (finding the due sessions and loading them);
- ``retention run`` (``projections.retention.archive``: the projections' rows of each
  session, the bundle exported and verified, snapshots, bases, rows deleted), in bundles of
  ``--batch`` sessions;
- ``audit verify`` of the chain afterwards (every base checked against the signed heads);
- ``retention restore`` of every bundle;
- what the events table's guard trigger (which refuses appends at archived versions) costs
  ``Engine.record_step``: with the bases in place, ``--pairs`` alternating slices of
  ``--seconds`` each with the trigger enabled and disabled, same engine and table, for 1 and
  ``--writers`` writers; the median ratio on/off of each pair.

It prints seconds, sessions/s and event rows/s of each, and the bundles' size. Run:
``.venv/bin/python bench/bench_retention.py [--sessions 1000] [--steps 5] [--batch 1000]
[--pairs 6] [--seconds 0.75] [--writers 4]``.
Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``); works in
scratch schemas that it drops, and removes its bundles and keys afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import INPUT, OUTPUT, USAGE, database_url, engine_writers, median, run_writers

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.projections import projector_for
from flowledger.projections.retention import archive


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=0.75)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    url = database_url()
    schema = f"bench_retention_{uuid.uuid4().hex[:10]}"
    console = Console()
    now = [datetime.now(UTC) - timedelta(days=100)]
    keys = Path(tempfile.mkdtemp(prefix="flowledger-bench-keys-"))
    out = Path(tempfile.mkdtemp(prefix="flowledger-bench-archive-"))
    settings = Settings.from_env().with_overrides(
        database_url=url, schema=schema, audit_key_dir=keys, checkpoint_every_events=0, checkpoint_every_s=0
    )
    try:
        with Engine(settings=settings, clock=lambda: now[0]) as engine:
            began = time.perf_counter()
            for n in range(args.sessions):
                session = f"bench-{n}"
                engine.start_session(session, "customer_service", user_id=f"user-{n}")
                for step in range(args.steps):
                    engine.record_step(session, f"step_{step}", input=INPUT, output=OUTPUT, usage=USAGE)
                engine.complete_session(session, "resolved")
            written = time.perf_counter() - began
            projector = projector_for(engine, batch_size=5000)
            projector.catch_up()
            engine.retention.set_policy("customer_service", 90)
            now[0] = datetime.now(UTC)
            rows: list[tuple[str, float, int, int]] = []

            began = time.perf_counter()
            dry = archive(engine, projector, out / "dry", dry_run=True)
            rows.append(("run --dry-run", time.perf_counter() - began, dry.sessions, dry.events))

            began = time.perf_counter()
            report = archive(engine, projector, out, batch_size=args.batch)
            archived = time.perf_counter() - began
            rows.append(("run", archived, report.sessions, report.events))
            bundles = [Path(b) for part in report.workflows for b in part.bundles]

            began = time.perf_counter()
            chain = verify_chain(engine.audit)
            rows.append(("audit verify (after)", time.perf_counter() - began, chain.archived, chain.events))
            if not chain.ok:
                raise SystemExit(f"the chain does not verify: {chain.findings[0].describe()}")

            guard = _guard_cost(engine, url, schema, args)

            began = time.perf_counter()
            restored = sum(engine.restore_sessions(b).events for b in bundles)
            rows.append(("restore", time.perf_counter() - began, report.sessions, restored))

        table = Table(
            title=f"retention: {args.sessions:,} sessions x {args.steps} steps"
            f" ({report.events:,} events; written in {written:.1f} s), bundles of {args.batch}"
        )
        for column in ("operation", "seconds", "sessions", "event rows", "sessions/s", "rows/s"):
            table.add_column(column, justify="left" if column == "operation" else "right")
        for name, seconds, sessions, events in rows:
            table.add_row(
                name,
                f"{seconds:.2f}",
                f"{sessions:,}",
                f"{events:,}",
                f"{sessions / seconds:,.0f}",
                f"{events / seconds:,.0f}",
            )
        console.print(table)
        for writers, ratios in guard.items():
            console.print(
                f"record_step with the guard trigger / without, {writers} writer(s): median"
                f" {median(ratios):.3f} over {len(ratios)} pairs"
                f" (min {min(ratios):.3f}, max {max(ratios):.3f})"
            )
        size = sum(b.stat().st_size for b in bundles)
        console.print(
            f"{len(bundles)} bundles, {size / 1e6:.1f} MB ({size / max(report.events, 1):,.0f} bytes/event)"
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
        with psycopg.connect(url, autocommit=True) as conn:
            names = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [schema]
            ).fetchall()
            for (name,) in names:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _guard_cost(engine: Engine, url: str, schema: str, args: argparse.Namespace) -> dict[int, list[float]]:
    """Ratios (trigger on / off) of ``record_step`` rates in alternating slices, per writer count."""
    table = sql.SQL("{}.flowledger_events").format(sql.Identifier(schema))
    switch = {
        True: sql.SQL("ALTER TABLE {} ENABLE TRIGGER flowledger_archived_versions").format(table),
        False: sql.SQL("ALTER TABLE {} DISABLE TRIGGER flowledger_archived_versions").format(table),
    }
    ratios: dict[int, list[float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for writers in sorted({1, args.writers}):
            for pair in range(args.pairs):
                rates = {}
                for on in (True, False) if pair % 2 == 0 else (False, True):
                    conn.execute(switch[on])
                    rates[on] = run_writers(writers, args.seconds, engine_writers(engine))
                ratios.setdefault(writers, []).append(rates[True] / rates[False])
        conn.execute(switch[True])
    return ratios


if __name__ == "__main__":
    main()
