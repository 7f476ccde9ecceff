"""A read of retention's tables inside an engine operation ends at the operation's deadline.

An outside probe (FLOWLEDGER_OPERATION_DEADLINE_S=3): ``flowledger history nosuch`` while
another session held a lock on ``flowledger_retention_bases`` (a retention run's, a VACUUM
FULL) was still waiting after 40 s, and through a PgBouncer in session pooling whose server
connections the engine's pool held it hung until PgBouncer's own query wait ran out: a
session not found is looked for among the archived ones on a connection of the audit trail's
own, which has no statement timeout and no watchdog.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres

HELD_S = 6.0
"""How long the other session holds the lock: past the deadline, so a read that waits for it fails."""


def test_a_session_looked_for_among_the_archived_ones_is_given_up_at_the_deadline(
    database_url: str, pg_schema: str
) -> None:
    # Given retention's tables, locked by another session for longer than the operation deadline
    settings = make_settings(database_url=database_url, schema=pg_schema, operation_deadline_s=1.0)
    with Engine(settings=settings) as engine:
        engine.retention.set_policy("wf", 30)
        locked = threading.Event()

        def hold() -> None:
            with psycopg.connect(database_url) as conn:
                conn.execute(
                    SQL("LOCK TABLE {}.flowledger_retention_bases IN ACCESS EXCLUSIVE MODE").format(
                        Identifier(pg_schema)
                    )
                )
                locked.set()
                time.sleep(HELD_S)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        assert locked.wait(10)

        # When the history of a session nobody started is asked for
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            engine.history("nobody-started-this")
        elapsed = time.monotonic() - started
        holder.join(HELD_S + 5)

    # Then it is given up at the deadline, not when the lock goes
    assert elapsed < 3.0, elapsed
