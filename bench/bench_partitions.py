"""Partitioned log (issue 17, item 3): appends and a projection rebuild with the events table
hash-partitioned by stream into 1 and 8 partitions (and unpartitioned, the default), each
beside its raw limit on the same layout:

- append: flowledger's recorder (``insert_events`` of one stored StepProcessed event per
  commit, chained), beside a plain psycopg ``INSERT`` of the same row bytes into a table of
  the same layout (same columns, keys, partitions and notification index; no id section,
  marker or chain), with 1 and 8 writers, each on streams of its own;
- rebuild: rebuilding current state, cost and funnel from the first event, beside a raw
  ``select_notifications`` + decode of the same events (as ``bench_projections.py``), each in
  a fresh process, on a log of ``--events`` synthetic session events.

Rounds of the append cells are interleaved and the median of each is printed; the rebuild
runs once per layout. Run:
``.venv/bin/python bench/bench_partitions.py [--layouts 0 1 8] [--writers 1 8] [--seconds 2]
[--rounds 3] [--events 200000]``. Uses FLOWLEDGER_DATABASE_URL, else the server at
127.0.0.1:5432 (db ``test``); works in scratch schemas that it drops.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg import sql
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support.synthetic
from _common import INPUT, OUTPUT, USAGE, database_url, median, run_writers, scratch_schema
from bench_projections import BATCH, THREE, events

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres import ddl
from flowledger.infrastructure.postgres import sql as pg_sql
from flowledger.projections import projector_for, rebuild
from tests.support.synthetic import append

Writer = Callable[[int], Callable[[], None]]


def layout_name(partitions: int) -> str:
    """How a layout is printed."""
    return f"{partitions} partition{'s' if partitions != 1 else ''}" if partitions else "unpartitioned"


def engine_for(url: str, schema: str, partitions: int, pool_size: int = 4) -> Engine:
    """An engine whose schema is made with ``partitions`` hash partitions (0: one table)."""
    return Engine(
        settings=Settings(
            home=Path("/nonexistent"),
            database_url=url,
            schema=schema,
            pool_size=pool_size,
            event_partitions=partitions,
            checkpoint_every_events=0,
            checkpoint_every_s=0,
        )
    )


def assert_layout(url: str, schema: str, table: str, partitions: int) -> None:
    """Refuse to report figures for a table that is not in the layout asked for."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT c.relkind::text, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) "
            "FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (f"{schema}.{table}",),
        ).fetchone()
    expected = ("p", partitions) if partitions else ("r", 0)
    if row != expected:
        raise SystemExit(f"{schema}.{table} is {row}, not {expected}")


def sample_row(url: str) -> tuple[str, bytes]:
    """The topic and stored bytes of one real StepProcessed event."""
    with scratch_schema(url, "bench_parts_sample") as schema, engine_for(url, schema, 0) as engine:
        engine.start_session("sample", "customer_service")
        engine.record_step("sample", "answer", input=INPUT, output=OUTPUT, usage=USAGE)
        stored = engine.log.stored(engine.session_uuid("sample"))[-1]
    return stored.topic, stored.state


def recorder_writers(engine: Engine, row: tuple[str, bytes]) -> Writer:
    """Each writer appends one event per commit to a stream of its own, through the recorder."""
    recorder = engine.log.recorder

    def make(i: int) -> Callable[[], None]:
        stream, version = uuid.uuid4(), [0]

        def step() -> None:
            version[0] += 1
            recorder.insert_events([StoredEvent(stream, version[0], row[0], row[1])])

        return step

    return make


def plain_writers(url: str, schema: str, partitions: int, row: tuple[str, bytes], conns: list[Any]) -> Writer:
    """Plain INSERTs of the same row bytes (and a hash and seal's worth) into the same layout."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in pg_sql.create_table(schema, "plain_events", "uuid", partitions=partitions):
            conn.execute(statement)
        conn.execute(ddl.create_notification_index(schema, "plain_events", partitioned=partitions > 0))
    assert_layout(url, schema, "plain_events", partitions)
    insert = sql.SQL(
        "INSERT INTO {}.plain_events (originator_id, originator_version, topic, state, transaction_id, "
        "event_hash, event_mac) VALUES (%s, %s, %s, %s, pg_current_xact_id(), %s, %s)"
    ).format(sql.Identifier(schema))
    digest = hashlib.sha256(row[1]).digest()

    def make(i: int) -> Callable[[], None]:
        conn = psycopg.connect(url, autocommit=True)
        conns.append(conn)
        stream, version = uuid.uuid4(), [0]

        def step() -> None:
            version[0] += 1
            conn.execute(insert, (stream, version[0], row[0], row[1], digest, digest), prepare=True)

        return step

    return make


def measure_append(
    case: str, url: str, partitions: int, writers: int, seconds: float, row: tuple[str, bytes]
) -> float:
    """Events per second for one case, layout and writer count, in a scratch schema of its own."""
    with scratch_schema(url, "bench_parts") as schema:
        if case == "recorder":
            with engine_for(url, schema, partitions, pool_size=max(writers, 2)) as engine:
                assert_layout(url, schema, "flowledger_events", partitions)
                return run_writers(writers, seconds, recorder_writers(engine, row))
        conns: list[Any] = []
        try:
            return run_writers(writers, seconds, plain_writers(url, schema, partitions, row, conns))
        finally:
            for conn in conns:
                conn.close()


def raw_read(url: str, schema: str, partitions: int, out: Any) -> None:
    """Child process: every notification in batches of ``BATCH``, each event decoded."""
    with engine_for(url, schema, partitions) as engine:
        recorder = engine.log.recorder
        began, position, decoded = time.perf_counter(), 0, 0
        while batch := recorder.select_notifications(start=position + 1, limit=BATCH):
            decoded += len([engine.log.decode(n) for n in batch])
            position = batch[-1].id
        out.put((decoded, time.perf_counter() - began))


def rebuild_three(url: str, schema: str, partitions: int, out: Any) -> None:
    """Child process: rebuild current state, cost dashboard and funnel from the first event."""
    with engine_for(url, schema, partitions) as engine:
        projector = projector_for(engine, batch_size=BATCH)
        head = engine.log.head()
        began = time.perf_counter()
        rebuild(projector, list(THREE))
        out.put((head, time.perf_counter() - began))


def in_child(target: Any, url: str, schema: str, partitions: int) -> tuple[int, float]:
    """Run ``target`` in a fresh process and return what it reports."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(url, schema, partitions, queue))
    process.start()
    result = queue.get()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"{target.__name__} failed with exit code {process.exitcode}")
    return result  # type: ignore[no-any-return]


def measure_rebuild(url: str, partitions: int, count: int, console: Console) -> tuple[int, float, float]:
    """Events, raw read seconds and rebuild seconds on a log of ``count`` events in this layout."""
    with scratch_schema(url, "bench_parts_proj") as schema:
        try:
            with engine_for(url, schema, partitions) as engine:
                assert_layout(url, schema, "flowledger_events", partitions)
                began = time.perf_counter()
                stored = append(engine.log, events(count), per_transaction=BATCH)
                console.print(
                    f"{layout_name(partitions)}: generated {stored:,} events "
                    f"in {time.perf_counter() - began:.1f} s"
                )
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("ANALYZE {}.flowledger_events").format(sql.Identifier(schema)))
            decoded, raw_s = in_child(raw_read, url, schema, partitions)
            head, rebuild_s = in_child(rebuild_three, url, schema, partitions)
            if decoded != stored or head < stored:
                raise SystemExit(f"read {decoded:,} and rebuilt through {head:,} of {stored:,} events")
            return stored, raw_s, rebuild_s
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                for (name,) in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [schema + "_"]
                ).fetchall():
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", type=int, nargs="+", default=[0, 1, 8], help="partitions (0: one table)")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per append cell per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=200_000, help="events in each rebuild's log")
    args = parser.parse_args()
    url = database_url()
    console = Console(width=150)
    command = ("bench/bench_partitions.py " + " ".join(sys.argv[1:])).strip()
    row = sample_row(url)
    appends: dict[tuple[str, int, int], list[float]] = {}
    for round_no in range(args.rounds):
        for writers in args.writers:
            for partitions in args.layouts:
                for case in ("recorder", "plain"):
                    rate = measure_append(case, url, partitions, writers, args.seconds, row)
                    appends.setdefault((case, partitions, writers), []).append(rate)
                    console.print(
                        f"round {round_no + 1}: {writers:>2} writers {layout_name(partitions):<14} "
                        f"{case:<9} {rate:8,.0f} events/s"
                    )
    table = Table(
        title="Append: one stored event per commit, events/s (median), ratio to a plain INSERT "
        f"into the same layout\n{command}"
    )
    table.add_column("layout")
    for writers in args.writers:
        table.add_column(f"{writers} writers: flowledger recorder", justify="right")
        table.add_column(f"{writers} writers: plain insert", justify="right")
    for partitions in args.layouts:
        cells = []
        for writers in args.writers:
            value = median(appends[("recorder", partitions, writers)])
            plain = median(appends[("plain", partitions, writers)])
            cells += [f"{value:,.0f} ({value / plain:.2f}x)", f"{plain:,.0f}"]
        table.add_row(layout_name(partitions), *cells)
    console.print(table)
    rebuilt = {n: measure_rebuild(url, n, args.events, console) for n in args.layouts}
    table = Table(
        title="Rebuild of current state, cost and funnel from the first event, beside a raw "
        f"select_notifications + decode of the same log (batches of {BATCH})\n{command}"
    )
    for column in ("layout", "events", "raw s", "raw events/s", "rebuild s", "rebuild events/s", "ratio"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for partitions, (count, raw_s, rebuild_s) in rebuilt.items():
        table.add_row(
            layout_name(partitions),
            f"{count:,}",
            f"{raw_s:.1f}",
            f"{count / raw_s:,.0f}",
            f"{rebuild_s:.1f}",
            f"{count / rebuild_s:,.0f}",
            f"{raw_s / rebuild_s:.2f}",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
