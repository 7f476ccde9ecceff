"""Each pytest-xdist worker's database (``tests/support/databases.worker_database``): made on the
server of the suite's URL, or, where the URL's role may not create databases (a
``FLOWLEDGER_TEST_DATABASE_URL`` given by someone else), the URL's own database, as before."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tests.support.databases import BackgroundDrops, worker_database


def _current_database(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


def test_a_worker_gets_a_database_named_after_the_urls_and_its_own_id(
    database_url: str, database_drops: BackgroundDrops
) -> None:
    worker = f"gw{uuid.uuid4().hex[:8]}"  # a worker id no run uses: the database made is this test's
    made = worker_database(database_url, worker)
    try:
        assert _current_database(made) == f"{_current_database(database_url)}_{worker}"
        assert worker_database(database_url, "master") == database_url
    finally:
        # Dropped in the background: a drop waits for a checkpoint, which in the middle of a run
        # syncs every test schema's dirty pages (this test took 106 s in a loaded clean-clone run,
        # almost all of it in the drop; the run's end waits for it).
        database_drops.drop(database_url, f"{_current_database(database_url)}_{worker}")


def test_a_role_that_may_not_create_databases_works_in_the_urls_own(database_url: str) -> None:
    # Given a URL whose role may log in but not create databases
    role = f"no_createdb_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB").format(sql.Identifier(role)))
    try:
        parts = urlsplit(database_url)
        url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))
        # When a worker asks for its database
        given = worker_database(url, "gw7")
        # Then it works in the URL's own database, with no error
        assert given == url
        assert _current_database(given) == _current_database(database_url)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
