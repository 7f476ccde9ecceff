"""A log moved to another schema name (``ALTER SCHEMA ... RENAME TO``, or a dump restored and
renamed beside the original) keeps working under its new name.

The append functions and retention's guard name the schema in their bodies (the table, the
sequence, the id section's lock key, derived from the schema's name). An outside probe renamed
a log's schema and started an engine on the new name: it started (the check at start read the
version row, the sequence and the last row, all fine) and read, and every append failed with
the event library's ``ProgrammingError: schema "<old name>" does not exist`` ("a bug in
flowledger", exit 70), for good.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres import sql as pg_sql
from flowledger.infrastructure.postgres.database import drop_schema, migrate
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


@pytest.fixture
def moved(database_url: str, pg_schema: str) -> Iterator[str]:
    """The name ``pg_schema`` is renamed to (dropped afterwards)."""
    name = f"{pg_schema}_moved"
    yield name
    drop_schema(database_url, name)


def test_an_engine_on_a_renamed_schema_appends_and_retention_still_guards_it(
    database_url: str, pg_schema: str, moved: str
) -> None:
    # Given a log with a step and a retention policy (its guard on the events table), renamed
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s", "wf")
        engine.record_step("s", "answer", input={"q": 1})
        engine.retention.set_policy("wf", 30)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL("ALTER SCHEMA {} RENAME TO {}").format(Identifier(pg_schema), Identifier(moved)))

    # When an engine starts on the new name and records steps
    with Engine(settings=make_settings(database_url=database_url, schema=moved)) as engine:
        engine.record_step("s", "answer", input={"q": 2})
        engine.start_session("t", "wf")
        version = engine.get_session("s").version

    # Then they are stored, and the functions now take the new name's lock
    assert version == 3
    key = str(pg_sql.section_lock_key(moved, "flowledger_events"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        bodies = conn.execute(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s",
            (moved,),
        ).fetchall()
    assert {name for name, body in bodies if key in body} == {
        "flowledger_events_append",
        "flowledger_events_append_one",
    }
    assert all(pg_schema + '"' not in body for _, body in bodies)


def test_migrate_on_a_renamed_schema_says_it_made_the_functions_again(
    database_url: str, pg_schema: str, moved: str
) -> None:
    # Given a migrated schema, renamed
    migrate(database_url, pg_schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL("ALTER SCHEMA {} RENAME TO {}").format(Identifier(pg_schema), Identifier(moved)))

    # When it is migrated under its new name, twice
    first = migrate(database_url, moved)
    second = migrate(database_url, moved)

    # Then the first made the functions again, and the second found nothing to do
    assert first.locked
    assert first.functions_remade
    assert not second.locked
