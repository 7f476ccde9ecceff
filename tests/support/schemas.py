"""Scratch schemas of the tests: named after the run, dropped after each test and swept at the end.

Every schema a test run makes is named ``t_<run>_…`` (``scratch_schema``), and everything
derived from it (projection builds, reader views, tenants, the schemas a CLI or server
subprocess creates for it) starts with that name. So one sweep at the end of the run
(``drop_run_schemas``, from the session fixture in ``tests/conftest.py``) drops whatever a
test left behind, and only this run's: other runs on the same database keep theirs.
``FLOWLEDGER_TEST_RUN_ID`` names the run (a test that runs pytest in a subprocess uses it).
"""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg import sql

RUN_ID = os.environ.get("FLOWLEDGER_TEST_RUN_ID") or uuid.uuid4().hex[:6]
RUN_PREFIX = f"t_{RUN_ID}_"


def scratch_schema(kind: str = "") -> str:
    """A fresh schema name of this run (``kind``: a few letters that say who made it)."""
    return f"{RUN_PREFIX}{kind}{uuid.uuid4().hex[:12]}"


def schemas_starting_with(database_url: str, prefix: str) -> list[str]:
    """The schemas whose names start with ``prefix`` (literally: ``_`` is no wildcard)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s) ORDER BY 1", [prefix]
        ).fetchall()
    return [name for (name,) in rows]


def _drop_all(database_url: str, names: list[str]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def drop_schemas(database_url: str, schema: str) -> None:
    """Drop ``schema`` and every schema named after it (projection builds, reader views, tenants),
    the schema itself last, all on one connection (three per database test before)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR starts_with(nspname, %s)"
            " ORDER BY nspname = %s, nspname",
            [schema, schema + "_", schema],
        ).fetchall()
        for (name,) in rows:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def drop_run_schemas(database_url: str, prefix: str = RUN_PREFIX) -> list[str]:
    """Drop every schema of the run named by ``prefix``; the names that were still there."""
    left = schemas_starting_with(database_url, prefix)
    _drop_all(database_url, left)
    return left
