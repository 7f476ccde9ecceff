"""Scratch databases of the tests: dropped in a thread of their own, waited for at the run's end.

Dropping a database makes PostgreSQL checkpoint (every dirty buffer written and synced) before
``DROP DATABASE`` returns: under the whole suite's writes that held a worker in a module's
teardown for 78-106 s (test_collation_order, test_feed_horizon in a run of 2026-12-06), running
no test meanwhile. ``BackgroundDrops.drop`` starts the drop and returns; ``wait`` (at the end of
the run, from the session fixture ``database_drops`` in ``tests/conftest.py``) waits for every
drop and raises if one failed, so no database is left behind unnoticed.
"""

from __future__ import annotations

import threading

import psycopg
from psycopg import sql


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
