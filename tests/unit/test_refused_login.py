"""Which connection failures are a refused login (not retried) and which an outage (retried)."""

from __future__ import annotations

import psycopg
import pytest

from flowledger.infrastructure.postgres.database import refused_login

HOST = 'connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    "message",
    [
        HOST + 'FATAL:  database "flows" does not exist',
        HOST + 'FATAL:  role "app" does not exist',
        HOST + 'FATAL:  password authentication failed for user "app"',
        HOST + 'FATAL:  no pg_hba.conf entry for host "10.0.0.5", user "app", database "flows"',
        HOST + 'FATAL:  permission denied for database "flows"',
        # The URL's own options, which the server (or libpq) refuses on every try
        HOST + "server does not support SSL, but SSL was required",
        HOST + 'FATAL:  invalid value for parameter "statement_timeout": "x"',
        HOST + 'FATAL:  unrecognized configuration parameter "statment_timeout"',
        HOST + "SSL error: certificate verify failed",
    ],
)
def test_a_login_the_server_refused_is_not_worth_another_try(message: str) -> None:
    assert refused_login(psycopg.OperationalError(message))


@pytest.mark.parametrize(
    "message",
    [
        HOST + "Connection refused",
        HOST + "FATAL:  the database system is starting up",
        HOST + "FATAL:  the database system is shutting down",
        HOST + "FATAL:  sorry, too many clients already",
        "connection timeout expired",
        "server closed the connection unexpectedly",
        # A relation that does not exist is a query's error, not a refused login
        'relation "flows.events" does not exist',
    ],
)
def test_an_outage_is_tried_again(message: str) -> None:
    assert not refused_login(psycopg.OperationalError(message))


def test_only_operational_errors_are_logins() -> None:
    assert not refused_login(ValueError('FATAL:  database "x" does not exist'))
