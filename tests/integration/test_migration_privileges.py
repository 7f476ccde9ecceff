"""An engine started by a role that may read and write the log but not create (no CREATE on the
database or the schema, not the owner of its objects): ``migrate`` creates nothing that exists,
and a fix only the owner may make is a flowledger error that says which and who.

An outside probe: with the notification sequence at CACHE 10, such a role's ``Engine()`` raised
psycopg's ``InsufficientPrivilege: permission denied for database`` (exit 1 with that line),
from the locked migration's ``CREATE SCHEMA IF NOT EXISTS``, which needs CREATE even when the
schema exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import FlowledgerError, MigrationRefused
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.conftest import make_settings
from tests.support.cli import run_cli

pytestmark = pytest.mark.postgres


def _as(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


def _execute(url: str, statement: SQL | str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture
def dml_role(database_url: str, pg_schema: str) -> Iterator[str]:
    """A URL for a new role that may use the migrated schema's tables, sequence and functions,
    and create nothing (the database's default grants); dropped afterwards."""
    migrate(database_url, pg_schema)
    role = f"r_{uuid.uuid4().hex[:12]}"
    s, r = Identifier(pg_schema), Identifier(role)
    _execute(database_url, SQL("CREATE ROLE {} LOGIN").format(r))
    try:
        for grant in (
            "GRANT USAGE ON SCHEMA {s} TO {r}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
            "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}",
        ):
            _execute(database_url, SQL(grant).format(s=s, r=r))
        yield _as(database_url, role)
    finally:
        _execute(database_url, SQL("DROP OWNED BY {}").format(r))  # its grants
        _execute(database_url, SQL("DROP ROLE {}").format(r))


def _engine(url: str, schema: str) -> Engine:
    return Engine(settings=make_settings(database_url=url, schema=schema))


def test_a_role_that_may_not_create_runs_the_locked_migration_when_it_has_nothing_to_create(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given a schema whose version row names another cluster (as after a restore): the next
    # start takes the migration lock to check the log's transaction ids, and creates nothing
    _execute(
        database_url,
        SQL("UPDATE {}.flowledger_schema SET cluster_id = 'elsewhere'").format(Identifier(pg_schema)),
    )
    # When the role starts an engine, Then it starts (no CREATE SCHEMA or CREATE TABLE ran)
    engine = _engine(dml_role, pg_schema)
    try:
        assert engine.start_session("s", "wf").version == 1
    finally:
        engine.close()
    # ... and the check is recorded: the next start takes no lock
    assert not migrate(database_url, pg_schema).locked


def test_a_sequence_cache_only_the_owner_may_reset_is_a_flowledger_error_that_says_so(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given the log's sequence at CACHE 10, set by its owner
    sequence = SQL("{}.flowledger_events_notification_id_seq").format(Identifier(pg_schema))
    _execute(database_url, SQL("ALTER SEQUENCE {} CACHE 10").format(sequence))
    # When the role that may not alter it starts an engine
    with pytest.raises(MigrationRefused) as refused:
        _engine(dml_role, pg_schema)
    # Then the error is flowledger's, names the sequence and the fix
    assert isinstance(refused.value, FlowledgerError)
    assert refused.value.schema == pg_schema
    message = str(refused.value)
    assert "flowledger_events_notification_id_seq has CACHE 10 and needs CACHE 1" in message
    assert "its owner should run `flowledger migrate`" in message
    # ... and so does the command line, in one line, exit 1 (waiting will not mend it)
    result = run_cli(dml_role, pg_schema, "history", "x")
    assert result.returncode == 77, result.stderr  # EX_NOPERM: its owner must migrate it
    assert result.stderr.count("\n") == 1
    assert "needs CACHE 1" in result.stderr
    assert "Traceback" not in result.stderr
    # When the owner migrates, Then the role's engines start again
    assert migrate(database_url, pg_schema).sequence_cache_reset
    _engine(dml_role, pg_schema).close()


def test_a_role_that_may_not_create_uses_the_api_keys_table_its_owner_made(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given the API keys table made by the owner, and the role allowed to use it
    owner = PostgresKeyStore(database_url, pg_schema)
    try:
        owner.list()
    finally:
        owner.close()
    role = urlsplit(dml_role).netloc.partition("@")[0]
    _execute(
        database_url,
        SQL("GRANT SELECT, INSERT, UPDATE ON {}.api_keys TO {}").format(
            Identifier(pg_schema), Identifier(role)
        ),
    )

    # When the role creates and lists keys (as `flowledger keys` and `serve` do)
    keys = PostgresKeyStore(dml_role, pg_schema)
    try:
        issued = keys.create("acme", "reader")
        listed = keys.list()
    finally:
        keys.close()

    # Then it may (an outside probe saw "permission denied for database": the store ran
    # CREATE SCHEMA IF NOT EXISTS on every first use, which needs CREATE even when it exists)
    assert [key.key_id for key in listed] == [issued.key.key_id]


def test_a_role_that_may_not_create_reads_the_projections_its_owner_installed(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given the projections installed by the owner, and the role allowed to use their schemas
    for args in (("projections", "status"), ("dashboard",)):
        installed = run_cli(database_url, pg_schema, *args)
        assert installed.returncode == 0, installed.stderr
    role = Identifier(urlsplit(dml_role).netloc.partition("@")[0])
    with psycopg.connect(database_url, autocommit=True) as conn:
        schemas = [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", [f"{pg_schema}\\_%"]
            )
        ]
    assert schemas, "the owner's `projections status` installed no projection schema"
    for schema in schemas:
        s = Identifier(schema)
        _execute(database_url, SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, role))
        _execute(
            database_url,
            SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(s, role),
        )
        _execute(database_url, SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(s, role))

    # When the role reads them (as an operator's dashboard and status do)
    done = [run_cli(dml_role, pg_schema, *args) for args in (("projections", "status"), ("dashboard",))]

    # Then it may (an outside probe saw "permission denied for database": every read ran the
    # control tables' CREATE SCHEMA / TABLE IF NOT EXISTS, which need CREATE even when they exist)
    assert [d.returncode for d in done] == [0, 0], [d.stderr for d in done]


def test_a_role_that_may_not_alter_an_api_keys_table_made_before_expiry_is_told_who_may(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given the API keys table as a version before keys could expire made it, its owner's, and
    # the role allowed to use it
    table = SQL("{}.api_keys").format(Identifier(pg_schema))
    _execute(
        database_url,
        SQL(
            "CREATE TABLE {} (key_id text PRIMARY KEY, tenant text NOT NULL, role text NOT NULL,"
            " token_sha256 bytea NOT NULL, label text NOT NULL DEFAULT '',"
            " created_at timestamptz NOT NULL DEFAULT now(), revoked_at timestamptz)"
        ).format(table),
    )
    role = urlsplit(dml_role).netloc.partition("@")[0]
    _execute(database_url, SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(table, Identifier(role)))
    # When the role lists keys (as `flowledger keys` and `serve` do), Then it is told the table
    # needs its expiry column and that its owner adds it by running any `flowledger keys` command
    keys = PostgresKeyStore(dml_role, pg_schema)
    try:
        with pytest.raises(MigrationRefused) as refused:
            keys.list()
    finally:
        keys.close()
    assert "api_keys has no expires_at column" in str(refused.value)
    assert "its owner should run `flowledger keys list`" in str(refused.value)
    result = run_cli(dml_role, pg_schema, "keys", "list")
    assert result.returncode == 77, result.stderr
    assert result.stderr.count("\n") == 1
    # And once the owner has, the role's store works, the old keys never expiring
    owner = PostgresKeyStore(database_url, pg_schema)
    try:
        owner.list()
    finally:
        owner.close()
    keys = PostgresKeyStore(dml_role, pg_schema)
    try:
        issued = keys.create("acme", "reader")
        assert [key.key_id for key in keys.list()] == [issued.key.key_id]
    finally:
        keys.close()


def test_a_role_that_may_not_alter_an_api_keys_table_made_before_sign_outs_is_told_who_may(
    database_url: str, pg_schema: str, dml_role: str
) -> None:
    # Given the API keys table as a version before dashboard sign-outs were kept made it (with
    # its expiry column), its owner's, and the role allowed to use it
    table = SQL("{}.api_keys").format(Identifier(pg_schema))
    _execute(
        database_url,
        SQL(
            "CREATE TABLE {} (key_id text PRIMARY KEY, tenant text NOT NULL, role text NOT NULL,"
            " token_sha256 bytea NOT NULL, label text NOT NULL DEFAULT '',"
            " created_at timestamptz NOT NULL DEFAULT now(), revoked_at timestamptz, expires_at timestamptz)"
        ).format(table),
    )
    role = urlsplit(dml_role).netloc.partition("@")[0]
    _execute(database_url, SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(table, Identifier(role)))
    # When the role lists keys, Then it is told which column is missing and who adds it
    keys = PostgresKeyStore(dml_role, pg_schema)
    try:
        with pytest.raises(MigrationRefused) as refused:
            keys.list()
    finally:
        keys.close()
    assert "api_keys has no sessions_ended_until column" in str(refused.value)
    assert "its owner should run `flowledger keys list`" in str(refused.value)
    # And once its owner has run a keys command, the role signs a session out
    owner = PostgresKeyStore(database_url, pg_schema)
    try:
        issued = owner.create("acme", "reader")
    finally:
        owner.close()
    keys = PostgresKeyStore(dml_role, pg_schema)
    try:
        keys.end_sessions(issued.key.key_id, 1_900_000_000)
        found = keys.by_id(issued.key.key_id)
    finally:
        keys.close()
    assert found is not None
    assert found[0].sessions_ended_until == 1_900_000_000
