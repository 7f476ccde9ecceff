"""A role that may only read the log (SELECT on the schema's tables): every write is
``StoreForbidden``, one clear error (CLI exit 77, HTTP 503 without ``Retry-After``: waiting
will not mend it), and its reads work.

An outside probe, as such a role: ``record_step``, ``start_session`` and ``create_task`` raised
the event library's ``ProgrammingError`` ("permission denied for sequence
flowledger_events_notification_id_seq"), and ``flowledger extend`` and ``flowledger budgets
set`` ended with exit 70 and "unexpected ProgrammingError (a bug in flowledger)".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import StoreForbidden
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

pytestmark = pytest.mark.postgres


def _as(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


def _execute(url: str, statement: SQL) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture
def reader_url(database_url: str, pg_schema: str) -> Iterator[str]:
    """A URL for a new role with USAGE on the schema and SELECT on its tables, nothing more, over
    a schema that holds session ``s`` (made by the owner); the role is dropped afterwards."""
    owner = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        owner.start_session("s", "wf")
    finally:
        owner.close()
    role = f"r_{uuid.uuid4().hex[:12]}"
    s, r = Identifier(pg_schema), Identifier(role)
    _execute(database_url, SQL("CREATE ROLE {} LOGIN").format(r))
    try:
        _execute(database_url, SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r))
        _execute(database_url, SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(s, r))
        yield _as(database_url, role)
    finally:
        _execute(database_url, SQL("DROP OWNED BY {}").format(r))
        _execute(database_url, SQL("DROP ROLE {}").format(r))


def test_a_read_only_role_reads_and_every_write_it_tries_is_store_forbidden(
    reader_url: str, pg_schema: str
) -> None:
    # Given an engine of a role that may only read
    engine = Engine(settings=make_settings(database_url=reader_url, schema=pg_schema))
    try:
        # When it reads, Then it reads
        assert engine.get_session("s").version == 1
        # When it writes, Then each write is StoreForbidden, naming what the server refused
        writes = {
            "record_step": lambda: engine.record_step("s", "greet", input={"q": 1}),
            "start_session": lambda: engine.start_session("new", "wf"),
            "create_task": lambda: engine.create_task("t-1", "Write the chart", ["helm"]),
        }
        for name, write in writes.items():
            with pytest.raises(StoreForbidden, match="permission denied") as raised:
                write()
            assert raised.value.operation == "save", name
        # and nothing was appended
        assert engine.get_session("s").version == 1
    finally:
        engine.close()


def test_the_cli_of_a_read_only_role_says_so_in_one_line_with_exit_77(
    reader_url: str, pg_schema: str
) -> None:
    # When a read-only role's CLI writes (a session's expiry, a budget)
    writes = (
        ("extend", "s", "--hours", "1"),
        ("budgets", "set", "tenant", "--period", "day", "--limit", "5"),
    )
    for args in writes:
        done = run_cli(reader_url, pg_schema, *args)

        # Then it exits 77 (EX_NOPERM) with one line saying the role may not, not a bug's 70
        assert done.returncode == 77, (args, done.stderr)
        assert done.stderr.count("error:") == 1
        assert "the database role may not do this" in done.stderr
        assert "a bug in flowledger" not in done.stderr


def test_a_read_only_roles_server_answers_a_write_503_naming_the_refusal_and_no_retry_after(
    reader_url: str, pg_schema: str
) -> None:
    # Given a server whose engine's role may only read
    engine = Engine(settings=make_settings(database_url=reader_url, schema=pg_schema))
    try:
        http = TestClient(create_app(engine, require_keys=False))
        assert http.get("/v1/sessions/s").status_code == 200
        # When a client records a step
        answered = http.post("/v1/sessions/s/steps", json={"step": "greet"})
        # Then it is told the store refused, and not to come back later (a 503 with
        # Retry-After had clients retry a refusal no wait mends)
        assert answered.status_code == 503, answered.text
        assert "permission denied" in answered.json()["error"]
        assert "Retry-After" not in answered.headers
        assert engine.get_session("s").version == 1
    finally:
        engine.close()
