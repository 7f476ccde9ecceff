"""Turning a database URL into the event library's settings, and preparing the schema."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from flowledger.infrastructure.settings import MEMORY_URL

POSTGRES_FACTORY_TOPIC = "flowledger.infrastructure.postgres.factory:FlowledgerPostgresFactory"
"""The library factory for PostgreSQL: its event log is flowledger's recorder (issue 6)."""


def library_env(database_url: str, *, schema: str, pool_size: int) -> dict[str, str]:
    """The ``eventsourcing`` environment for a libpq URL (or ``memory:``)."""
    if database_url == MEMORY_URL:
        return {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    params = conninfo_to_dict(database_url)
    return {
        "PERSISTENCE_MODULE": POSTGRES_FACTORY_TOPIC,
        "POSTGRES_DBNAME": str(params.get("dbname") or params.get("user") or "postgres"),
        "POSTGRES_HOST": str(params.get("host") or "localhost"),
        "POSTGRES_PORT": str(params.get("port") or "5432"),
        "POSTGRES_USER": str(params.get("user") or "postgres"),
        "POSTGRES_PASSWORD": str(params.get("password") or ""),
        "POSTGRES_SCHEMA": schema,
        # The library opens POOL_SIZE connections up front: keep that small and let
        # the pool grow to ``pool_size`` under load.
        "POSTGRES_POOL_SIZE": str(min(2, pool_size)),
        "POSTGRES_MAX_OVERFLOW": str(max(pool_size - 2, 0)),
        "POSTGRES_PRE_PING": "n",
        # Never hold a transaction across a model call; 5 s is the library's guard.
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "5",
    }


def ensure_schema(database_url: str, schema: str) -> None:
    """Create ``schema`` if it does not exist (the library's DDL needs it first)."""
    if database_url == MEMORY_URL:
        return
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def drop_schema(database_url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (tests and scratch rebuilds)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
