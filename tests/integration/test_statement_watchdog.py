"""The statement watchdog (``postgres/watchdog.py``): a statement still running when its
operation ends is cancelled, and cut off if the server does not act on the cancel; a
connection it acted on is never lent again."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg
import pytest

from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.postgres.deadlines import ReconnectingPool
from flowledger.infrastructure.postgres.watchdog import GRACE_S, WATCHDOG, watching
from tests.faults.proxy import losing_proxy
from tests.support.bounded import SLACK_S

pytestmark = pytest.mark.postgres


def test_a_statement_on_a_connection_of_its_own_is_cancelled_when_its_operation_ends(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        started = time.monotonic()
        # When a watched statement runs past the operation's end
        with (
            pytest.raises(psycopg.errors.QueryCanceled),
            operation_deadline(0.5),
            watching(conn),
        ):
            conn.execute("SELECT pg_sleep(10)")
        # Then the server cancelled it at the end, and the connection is closed
        assert time.monotonic() - started < 0.5 + SLACK_S
        assert conn.closed


def test_a_statement_the_server_never_answers_is_cut_off_after_the_grace(database_url: str) -> None:
    upstream = urlsplit(database_url)
    with losing_proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        conn = psycopg.connect(proxy.url_for(database_url), autocommit=True)
        try:
            cut = WATCHDOG.cut
            # Given a path that stops relaying (the cancel request is held too)
            proxy.stall()
            started = time.monotonic()
            # When a watched statement is sent
            with pytest.raises(psycopg.OperationalError), operation_deadline(0.5), watching(conn):
                conn.execute("SELECT 1")
            # Then its socket is shut down one grace after the end, and libpq's wait returns
            assert time.monotonic() - started < 0.5 + GRACE_S + SLACK_S
            assert WATCHDOG.cut == cut + 1
        finally:
            proxy.resume()
            conn.close()


def test_a_pooled_connection_the_watchdog_acted_on_is_replaced_not_lent_again(database_url: str) -> None:
    pool = ReconnectingPool(database_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True)
    try:
        with pool.connection() as first:
            pid = first.info.backend_pid
        # When a statement on it outlives its operation
        with operation_deadline(0.3), pool.connection() as conn:
            assert conn.info.backend_pid == pid
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(10)")
        # Then the next borrower gets a new session (a late cancel cannot reach its statement)
        with operation_deadline(5.0), pool.connection() as conn:
            assert conn.info.backend_pid != pid
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_an_operation_that_has_ended_takes_no_connection(database_url: str) -> None:
    pool = ReconnectingPool(database_url, min_size=1, max_size=1, open=True)
    try:
        with operation_deadline(0.0), pytest.raises(psycopg.OperationalError, match="deadline passed"):
            pool.getconn()
    finally:
        pool.close()
