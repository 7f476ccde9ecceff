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
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql

T = TypeVar("T")

RUN_ID = os.environ.get("FLOWLEDGER_TEST_RUN_ID") or uuid.uuid4().hex[:6]
RUN_PREFIX = f"t_{RUN_ID}_"


def scratch_schema(kind: str = "") -> str:
    """A fresh schema name of this run (``kind``: a few letters that say who made it)."""
    return f"{RUN_PREFIX}{kind}{uuid.uuid4().hex[:12]}"


_kept: dict[str, psycopg.Connection[Any]] = {}
"""This process's connection for schema drops and lookups: one, to the last database used."""
_kept_lock = threading.Lock()


def _on_kept_connection(database_url: str, use: Callable[[psycopg.Connection[Any]], T]) -> T:
    """``use`` on this process's one autocommit connection to ``database_url``, made on first
    use (closing the one kept for another database, which it would keep busy) and made again
    once if it was lost (a test that restarted or cut the server).

    A connection per drop cost PostgreSQL a backend's start and exit (6-7 ms of its CPU) for
    every database test, thousands a run on CI's two cores."""
    with _kept_lock:
        try:
            return use(_kept_connection(database_url))
        except psycopg.OperationalError:
            _kept.pop(database_url).close()
            return use(_kept_connection(database_url))


def _kept_connection(database_url: str) -> psycopg.Connection[Any]:
    """The kept connection to ``database_url``, made (and another database's closed) if need be."""
    conn = _kept.get(database_url)
    if conn is None or conn.closed:
        for other in _kept.values():
            other.close()
        _kept.clear()
        conn = _kept[database_url] = psycopg.connect(database_url, autocommit=True)
    return conn


def schemas_starting_with(database_url: str, prefix: str) -> list[str]:
    """The schemas whose names start with ``prefix`` (literally: ``_`` is no wildcard)."""
    rows = _on_kept_connection(
        database_url,
        lambda conn: conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s) ORDER BY 1", [prefix]
        ).fetchall(),
    )
    return [name for (name,) in rows]


def _drop(conn: psycopg.Connection[Any], names: list[str]) -> None:
    for name in names:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _drop_all(database_url: str, names: list[str]) -> None:
    _on_kept_connection(database_url, lambda conn: _drop(conn, names))


def drop_schemas(database_url: str, schema: str) -> None:
    """Drop ``schema`` and every schema named after it (projection builds, reader views, tenants),
    the schema itself last, all on the process's kept connection."""

    def drop(conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR starts_with(nspname, %s)"
            " ORDER BY nspname = %s, nspname",
            [schema, schema + "_", schema],
        ).fetchall()
        _drop(conn, [name for (name,) in rows])

    _on_kept_connection(database_url, drop)


def drop_run_schemas(database_url: str, prefix: str = RUN_PREFIX) -> list[str]:
    """Drop every schema of the run named by ``prefix``; the names that were still there."""
    left = schemas_starting_with(database_url, prefix)
    _drop_all(database_url, left)
    return left
