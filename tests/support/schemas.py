"""Scratch schemas of the tests: one way to drop a test's schema and the ones named after it."""

from __future__ import annotations

import psycopg
from psycopg import sql

from flowledger.infrastructure.postgres.database import drop_schema


def drop_schemas(database_url: str, schema: str) -> None:
    """Drop ``schema`` and every schema named after it (projection builds, reader views, tenants)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        names = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [schema + "_"]
        ).fetchall()
        for (name,) in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    drop_schema(database_url, schema)
