"""Scratch databases of the tests: dropped in a thread of their own, waited for at the run's end.

Dropping a database makes PostgreSQL checkpoint (every dirty buffer written and synced) before
``DROP DATABASE`` returns: under the whole suite's writes that held a worker in a module's
teardown for 78-106 s (test_collation_order, test_feed_horizon in a run of 2026-12-06), running
no test meanwhile. ``BackgroundDrops.drop`` starts the drop and returns; ``wait`` (at the end of
the run, from the session fixture ``database_drops`` in ``tests/conftest.py``) waits for every
drop and raises if one failed, so no database is left behind unnoticed.

Each pytest-xdist worker works in a database of its own (``worker_database``), made once and
kept rather than dropped at the end, for the same checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo


class BackgroundDrops:
    """Databases being dropped, each by a thread of its own."""

    def __init__(self) -> None:
        """No drop yet."""
        self._threads: list[threading.Thread] = []
        self._errors: list[str] = []

    def drop(self, database_url: str, name: str) -> None:
        """Start ``DROP DATABASE name WITH (FORCE)`` on the server of ``database_url``."""

        def run() -> None:
            try:
                with psycopg.connect(database_url, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            except Exception as error:  # reported by wait()
                self._errors.append(f"{name}: {error}")

        thread = threading.Thread(target=run, name=f"drop-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self, timeout_s: float = 300.0) -> None:
        """Wait for every drop started; raise if one failed or is still running."""
        for thread in self._threads:
            thread.join(timeout_s)
        running = [t.name for t in self._threads if t.is_alive()]
        if running or self._errors:
            raise AssertionError(f"scratch databases not dropped: {running} {self._errors}")


def worker_database(database_url: str, worker: str) -> str:
    """The URL of a database of ``worker``'s own (a pytest-xdist worker id, ``gw0``) on the
    server of ``database_url``, named after that URL's database (``test_gw0``): made unless it
    exists, and kept for the next run (its schemas are dropped as a test's always are).

    The erasure's purge waits until no transaction open in its database can see the destroyed
    keys' old rows, for up to 30 s: with every worker in one database, any test of another
    worker that held a transaction open made a ``forget`` wait out its whole bound (and a CLI
    test comparing whole outputs read the purge's warning). A worker's database sees only its
    own worker's transactions. ``master`` (no xdist), and a role that may not create databases,
    keep ``database_url``'s database."""
    if worker == "master":
        return database_url
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        name = f"{row[0] if row else 'test'}_{worker}"
        # An earlier run's, or another run's made at the same moment: schemas keep runs apart.
        with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except psycopg.errors.InsufficientPrivilege:
                # A URL whose role may not create databases (one given in
                # FLOWLEDGER_TEST_DATABASE_URL): every worker in its database, as before.
                return database_url
    if database_url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(database_url)
        return urlunsplit(parts._replace(path="/" + quote(name)))
    return make_conninfo(database_url, dbname=name)
