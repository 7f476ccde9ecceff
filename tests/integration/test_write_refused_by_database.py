"""An append the database refuses for a reason of its own (a trigger, a rule or a constraint
someone added on the events table) is said to be that, not a bug in flowledger.

An outside probe added a ``BEFORE INSERT`` trigger raising 'audit trigger says no' on the events
table: ``flowledger agents register`` exited 70, "unexpected ProgrammingError (a bug in
flowledger): audit trigger says no CONTEXT: PL/pgSQL function ... SQL statement "INSERT INTO
..." ...", the server's whole context on one line.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoreRefused, WriteRefusedByDatabase
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from tests.conftest import make_settings
from tests.support.cli import run_cli

pytestmark = pytest.mark.postgres


def _refuse_inserts(database_url: str, schema: str, statement: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL(statement).format(s=Identifier(schema)))


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE FUNCTION {s}.say_no() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'audit trigger says no'; END $$; "
        "CREATE TRIGGER say_no BEFORE INSERT ON {s}.flowledger_events "
        "FOR EACH ROW EXECUTE FUNCTION {s}.say_no()",
        "ALTER TABLE {s}.flowledger_events ADD CONSTRAINT small_payloads CHECK (octet_length(state) < 0)",
    ],
    ids=["trigger", "check"],
)
def test_an_append_refused_by_the_database_says_so_and_is_not_retried(
    database_url: str, pg_schema: str, statement: str
) -> None:
    # Given a log whose events table refuses every insert by a rule added in the database
    migrate(database_url, pg_schema)
    _refuse_inserts(database_url, pg_schema, statement)

    # When an engine appends, and the command line does
    with (
        Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine,
        pytest.raises(WriteRefusedByDatabase) as refused,
    ):
        engine.start_session("s", "wf")
    result = run_cli(database_url, pg_schema, "agents", "register", "a1", "--name", "A", "--skill", "python")

    # Then it is a refusal naming the database's reason and the table, on one line, exit 1
    assert isinstance(refused.value, StoreRefused)
    assert f"{pg_schema}.flowledger_events" in str(refused.value)
    assert "CONTEXT" not in str(refused.value)
    assert result.returncode == 1, result.stderr
    assert "the database refused the write" in result.stderr
    assert "a bug in flowledger" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
