"""A schema a later flowledger migrated (its version row past this code's): engines of this
code start on it without the migration's lock or a write, and ``flowledger migrate`` says the
schema is newer rather than "already current".

An outside probe (version row set to 9 with this code at 7): every engine start took the locked
migration and rewrote the version row's ``migrated_at``, and ``flowledger migrate`` printed
"schema ... at version 9: already current".
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from flowledger.infrastructure.postgres.migrations import SCHEMA_VERSION
from tests.conftest import make_settings
from tests.support.cli import run_cli

pytestmark = pytest.mark.postgres

NEWER = SCHEMA_VERSION + 2


def _version_row(database_url: str, schema: str) -> tuple[int, object]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            SQL("SELECT version, migrated_at FROM {}.flowledger_schema").format(Identifier(schema))
        ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def _mark_newer(database_url: str, schema: str) -> None:
    migrate(database_url, schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL("UPDATE {}.flowledger_schema SET version = %s").format(Identifier(schema)), [NEWER])


def test_an_engine_starts_on_a_newer_schema_without_the_lock_or_a_write(
    database_url: str, pg_schema: str
) -> None:
    # Given a schema a later flowledger migrated
    _mark_newer(database_url, pg_schema)
    before = _version_row(database_url, pg_schema)

    # When this code migrates it as an engine's start does, and an engine starts and writes
    report = migrate(database_url, pg_schema)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s", "wf")

    # Then nothing took the lock or rewrote the version row, and the report names the version
    assert not report.locked
    assert report.version == NEWER
    assert _version_row(database_url, pg_schema) == before


def test_migrate_says_a_newer_schema_is_newer_not_current(database_url: str, pg_schema: str) -> None:
    # Given a schema a later flowledger migrated
    _mark_newer(database_url, pg_schema)

    # When an operator runs this code's migrate
    done = run_cli(database_url, pg_schema, "migrate")

    # Then it says the schema is newer than this code, and leaves it as it is
    assert done.returncode == 0, done.stderr
    assert f"at version {NEWER}: newer than this flowledger's {SCHEMA_VERSION}" in done.stdout
    assert "already current" not in done.stdout
    assert _version_row(database_url, pg_schema)[0] == NEWER
