"""A test run leaves no schema behind: each test drops its own, and the run sweeps what is left,
including the schemas a CLI subprocess created (``tests/support/schemas.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from flowledger.infrastructure.postgres.database import create_schema
from tests.support.cli import run_cli
from tests.support.schemas import RUN_PREFIX, drop_run_schemas, schemas_starting_with, scratch_schema

ROOT = Path(__file__).resolve().parents[2]


def test_a_schema_a_subprocess_made_and_nobody_dropped_is_left_to_the_runs_sweep(
    database_url: str, run_schemas: str
) -> None:
    # Given a CLI subprocess that made a schema of this run, which this test never drops
    schema = scratch_schema("cli")
    result = run_cli(database_url, schema, "migrate")
    assert result.returncode == 0, result.stderr
    # Then it is there now, under the run's prefix, for the sweep at the end of the run
    assert schema.startswith(run_schemas)
    assert schema in schemas_starting_with(database_url, RUN_PREFIX)


def test_the_sweep_drops_every_schema_of_a_run_and_only_that_runs(
    database_url: str, run_schemas: str
) -> None:
    # Given schemas of another run: a store a subprocess made, and schemas named after it
    prefix = f"t_{uuid.uuid4().hex[:6]}_"
    assert run_cli(database_url, f"{prefix}x", "migrate").returncode == 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in (f"{prefix}x_read", f"{prefix}x_projections", f"{prefix}y"):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    made = schemas_starting_with(database_url, prefix)
    assert len(made) == 4
    mine = scratch_schema("keep")
    create_schema(database_url, mine)
    # When that run is swept
    dropped = drop_run_schemas(database_url, prefix)
    # Then all of its schemas are gone, and this run's are not touched
    assert dropped == made
    assert schemas_starting_with(database_url, prefix) == []
    assert mine in schemas_starting_with(database_url, RUN_PREFIX)


def test_a_whole_pytest_run_leaves_no_schema_of_its_own_in_the_database(database_url: str) -> None:
    # Given a pytest run (a subprocess, with a run id we know) of a test whose CLI subprocess
    # leaves a schema behind on purpose
    run_id = uuid.uuid4().hex[:6]
    env = {**os.environ, "FLOWLEDGER_TEST_RUN_ID": run_id, "FLOWLEDGER_TEST_DATABASE_URL": database_url}
    tests = [
        f"{Path(__file__).relative_to(ROOT)}::{test_a_schema_a_subprocess_made_and_nobody_dropped_is_left_to_the_runs_sweep.__name__}"
    ]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pytest")), "-q", "-s", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Then it passed, swept the schema left behind, and no schema of that run remains
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "swept 1 schemas that tests left behind" in result.stdout
    assert schemas_starting_with(database_url, f"t_{run_id}_") == []
