"""The stores with pools of their own (API keys, budgets) say at once that the server refused
the login, naming the cause, as the engine's start does: not a pool wait ending in an outage."""

from __future__ import annotations

from time import monotonic

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flowledger.domain.errors import StoreRefused
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.budgets import PostgresBudgetLedger
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.conftest import make_settings

PROMPTLY_S = 3.0
"""Well short of the pool wait the settings below allow (an outage would take all of it)."""

REFUSALS = {"database": ("dbname", "nosuchdb_clifix"), "role": ("user", "nosuchrole_clifix")}


def refused_url(database_url: str, what: str) -> str:
    """``database_url`` with a database or a role the server does not have."""
    field, value = REFUSALS[what]
    return make_conninfo("", **{**conninfo_to_dict(database_url), field: value})


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_the_key_store_says_at_once_that_the_login_was_refused_and_why(
    database_url: str, pg_schema: str, what: str
) -> None:
    # Given a key store on a database (or as a role) the server does not have
    settings = make_settings(pool_timeout_s=10.0, operation_deadline_s=20.0)
    store = PostgresKeyStore(refused_url(database_url, what), pg_schema, settings)
    try:
        # When its keys are listed
        started = monotonic()
        with pytest.raises(StoreRefused) as refused:
            store.list()
        took = monotonic() - started
    finally:
        store.close()
    # Then the refusal comes promptly, naming the missing database or role and the setting
    assert took < PROMPTLY_S, took
    assert f'{what} "{REFUSALS[what][1]}" does not exist' in str(refused.value)
    assert "FLOWLEDGER_DATABASE_URL" in str(refused.value)


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_the_budget_ledger_says_at_once_that_the_login_was_refused_and_why(
    database_url: str, pg_schema: str, what: str
) -> None:
    # Given a budget ledger on a database (or as a role) the server does not have
    settings = make_settings(pool_timeout_s=10.0, operation_deadline_s=20.0)
    ledger = PostgresBudgetLedger(refused_url(database_url, what), pg_schema, settings)
    try:
        # When a reservation count is read
        started = monotonic()
        with pytest.raises(StoreRefused) as refused:
            ledger.open_reservations()
        took = monotonic() - started
    finally:
        ledger.close()
    # Then the refusal comes promptly, naming the missing database or role
    assert took < PROMPTLY_S, took
    assert f'{what} "{REFUSALS[what][1]}" does not exist' in str(refused.value)


def test_an_engine_whose_url_sets_an_option_the_server_refuses_says_so_at_once(
    database_url: str, pg_schema: str
) -> None:
    # Given a URL whose startup options the server refuses on every connection (before, the
    # engine's start tried again until the operation deadline, 15 s, as for an outage)
    url = make_conninfo("", **{**conninfo_to_dict(database_url), "options": "-c statement_timeout=x"})
    settings = make_settings(database_url=url, schema=pg_schema, operation_deadline_s=20.0)
    # When an engine starts on it
    started = monotonic()
    with pytest.raises(StoreRefused) as refused:
        Engine(settings=settings)
    # Then it is refused promptly, with the server's words and the setting to check
    assert monotonic() - started < PROMPTLY_S
    assert 'invalid value for parameter "statement_timeout": "x"' in str(refused.value)
    assert "FLOWLEDGER_DATABASE_URL" in str(refused.value)
