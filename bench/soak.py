"""The soak (issue 17): 3 servers and 2 projection followers on one schema under mixed load
for 10 minutes (``--seconds``), model calls through a faulty simulator, a projection rebuild
half-way and a server restart at 60 %; prints throughput, p99 latencies, refusals, memory over
time and lost or doubled events. Exit status 1 if anything was lost or doubled, an agent went
over capacity, the projections differ from a rebuild or a process died.

Run: ``make soak`` or ``.venv/bin/python bench/soak.py [--seconds 600]``. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards (with its projection schemas),
unless the run found a problem: then the schema and the processes' logs are kept and named.
The scenario itself is ``tests/support/soak.py``, which the test suite runs for 60 s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The scenario lives in tests/support, shared with the test suite.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import database_url

from tests.support.soak import check_succeeded, run_soak


def _drop(url: str, schema: str) -> None:
    """The schema and every schema named after it (projection builds, reader views)."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR starts_with(nspname, %s)",
            [schema, schema + "_"],
        ).fetchall()
        for (name,) in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument(
        "--reads-catch-up",
        action="store_true",
        help="dashboard reads catch the projections up themselves (default: read what followers keep)",
    )
    parser.add_argument(
        "--drop-on-failure",
        action="store_true",
        help="drop the schema and the logs even when the run found a problem (default: keep them)",
    )
    args = parser.parse_args()
    if not args.seconds > 0:
        parser.error("--seconds must be > 0")
    url = database_url()
    schema = f"soak_{uuid.uuid4().hex[:10]}"
    console = Console(width=140)
    console.print(f"soak started {datetime.now(UTC).isoformat(timespec='seconds')}, schema {schema}")
    workdir = Path(tempfile.mkdtemp(prefix="flowledger-soak-"))
    try:
        report = run_soak(
            url, schema, workdir, args.seconds, console=console, reads_catch_up=args.reads_catch_up
        )
    except BaseException:
        _drop(url, schema)
        console.print(f"the processes' logs are kept in {workdir}")
        raise
    report.print(console)
    problems = check_succeeded(report)
    for problem in problems:
        console.print(f"[red]{problem}[/red]")
    if problems and not args.drop_on_failure:
        # What went wrong is in the log: kept to look at (DROP SCHEMA ... CASCADE when done).
        console.print(f"kept for a look: the processes' logs in {workdir}, the schema {schema}")
        return 1
    _drop(url, schema)
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
