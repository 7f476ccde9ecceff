"""A follower reading the log from the primary against one reading it from a hot standby.

Both write the read models to the primary (a standby is read-only). Times a catch-up of the
three projections from the first event each way (twice each, in alternating order), then how long the
standby takes to replay the read models written. docs/projections.md (Replicas) says why the
follower reads the primary; this gives the throughput side of it.

Run: ``.venv/bin/python bench/bench_replica.py [--events 50000]``. Starts a private primary
and a ``pg_basebackup -R`` standby on loopback (``tests/faults/server.py``: as the ``postgres``
user under root) and removes both afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
from eventsourcing.persistence import ApplicationRecorder
from eventsourcing.postgres import PostgresDatastore
from psycopg.conninfo import conninfo_to_dict
from rich.console import Console
from rich.table import Table

from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.projections.processor import Projector
from flowledger.projections.registry import all_projections

# Run as a script (``make bench`` runs it from the repository root): the root for ``tests``,
# this folder for the other benchmarks' helpers.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]
from bench_projections import engine_for, events  # noqa: E402

from tests.faults.server import PrivateServer, new_root, wait_replayed  # noqa: E402
from tests.support.synthetic import append  # noqa: E402

BATCH = 5000


def standby_recorder(url: str, schema: str, table: str) -> FlowledgerApplicationRecorder:
    """The log's recorder on the standby (reads only: nothing is created there)."""
    params = conninfo_to_dict(url)
    datastore = PostgresDatastore(
        dbname=str(params["dbname"]),
        host=str(params["host"]),
        port=str(params["port"]),
        user=str(params["user"]),
        password="",
        schema=schema,
        pool_size=2,
        max_overflow=2,
    )
    return FlowledgerApplicationRecorder(datastore, events_table_name=table)


def drop_read_models(url: str, schema: str) -> None:
    """Every projection schema of ``schema`` (control, reader, builds), so a catch-up starts at 0."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [schema + "_"]
        ).fetchall()
        for (name,) in rows:
            conn.execute(psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(name)))


def catch_up(primary: PrivateServer, schema: str, recorder: ApplicationRecorder, mapper: object) -> float:
    """Seconds for a catch-up of the three projections from the first event."""
    drop_read_models(primary.url, schema)
    projector = Projector(
        database_url=primary.url,
        store_schema=schema,
        recorder=recorder,
        mapper=mapper,  # type: ignore[arg-type]
        projections=all_projections(),
        batch_size=BATCH,
    )
    began = time.perf_counter()
    projector.catch_up()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="about this many events")
    args = parser.parse_args()
    console = Console()
    primary = PrivateServer(new_root())
    standby: PrivateServer | None = None
    try:
        primary.start()
        standby = PrivateServer(new_root(), standby_of=primary)
        standby.start()
        schema = f"bench_replica_{uuid.uuid4().hex[:8]}"
        engine = engine_for(primary.url, schema)
        try:
            stored = append(engine.log, events(args.events), per_transaction=BATCH)
            log_replay = wait_replayed(primary.url, standby.url, timeout_s=120)
            console.print(f"{stored:,} events; the standby replayed the log {log_replay:.2f} s after")
            table = engine.log.recorder.events_table_name  # type: ignore[attr-defined]
            readers: dict[str, ApplicationRecorder] = {
                "log from the primary": engine.log.recorder,
                "log from the standby": standby_recorder(standby.url, schema, table),
            }
            seconds: dict[str, list[float]] = {name: [] for name in readers}
            replays: dict[str, list[float]] = {name: [] for name in readers}
            for turn in range(2):
                # The order alternates, so neither way always runs on a warmer cache.
                for name, recorder in list(readers.items())[:: 1 if turn == 0 else -1]:
                    seconds[name].append(catch_up(primary, schema, recorder, engine.log.mapper))
                    replays[name].append(wait_replayed(primary.url, standby.url, timeout_s=120))
        finally:
            engine.close()
        out = Table(title=f"follower catch-up, {stored:,} events, 3 projections, batches of {BATCH}")
        for column in ("reading", "seconds (each run)", "events/s (median)", "standby replay after, s"):
            out.add_column(column, justify="left" if column == "reading" else "right")
        for name in readers:
            runs = seconds[name]
            out.add_row(
                name,
                ", ".join(f"{s:.2f}" for s in runs),
                f"{stored / statistics.median(runs):,.0f}",
                ", ".join(f"{s:.2f}" for s in replays[name]),
            )
        console.print(out)
    finally:
        if standby is not None:
            standby.cleanup()
        primary.cleanup()


if __name__ == "__main__":
    main()
