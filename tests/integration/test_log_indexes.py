"""The events table's two unique indexes are what the log's invariants stand on: the primary key
``(originator_id, originator_version)`` refuses a second event at a stream's version (the
version check of every save), the index on notification ids refuses an id taken twice and lets
readers page through the log without scanning it.

An outside probe: after ``DROP INDEX <schema>.flowledger_events_notification_id_idx`` (or the
primary key's constraint dropped), ``flowledger migrate`` said "already current" and engines
started and wrote without either, for good.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import LogDamaged
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from tests.conftest import make_settings
from tests.support.partitions import LAYOUTS, layout_id

pytestmark = pytest.mark.postgres


def _unique_indexes(database_url: str, schema: str) -> set[str]:
    """The valid unique indexes of the events table, by their columns."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indisvalid",
            (f"{schema}.flowledger_events",),
        ).fetchall()
    return {str(row[0]).split(" USING btree ")[1] for row in rows}


def _drop(database_url: str, schema: str, statement: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL(statement).format(s=Identifier(schema)))


@pytest.mark.parametrize("pg_schema", LAYOUTS, indirect=True, ids=layout_id)
def test_an_engine_started_on_a_log_whose_unique_indexes_were_dropped_makes_them_again(
    database_url: str, pg_schema: str
) -> None:
    # Given a log with events, whose two unique indexes were dropped
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        engine.start_session("s", "wf")
    before = _unique_indexes(database_url, pg_schema)
    _drop(database_url, pg_schema, "DROP INDEX {s}.flowledger_events_notification_id_idx")
    _drop(database_url, pg_schema, "ALTER TABLE {s}.flowledger_events DROP CONSTRAINT flowledger_events_pkey")
    assert _unique_indexes(database_url, pg_schema) == set()

    # When an engine starts on it
    with Engine(settings=settings) as engine:
        engine.record_step("s", "answer", input={"q": 1})

    # Then both are back, and a save at a version already stored is refused again
    assert _unique_indexes(database_url, pg_schema) == before
    assert len(before) == 2
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.UniqueViolation),
    ):
        conn.execute(
            SQL(
                "INSERT INTO {s}.flowledger_events (originator_id, originator_version, topic, state, "
                "transaction_id) SELECT originator_id, originator_version, topic, state, transaction_id "
                "FROM {s}.flowledger_events LIMIT 1"
            ).format(s=Identifier(pg_schema))
        )


def test_migrate_says_what_it_made_again(database_url: str, pg_schema: str) -> None:
    # Given a migrated log without its index on notification ids
    migrate(database_url, pg_schema)
    _drop(database_url, pg_schema, "DROP INDEX {s}.flowledger_events_notification_id_idx")

    # When it is migrated again
    report = migrate(database_url, pg_schema)

    # Then the report names the index made
    assert report.locked
    assert report.indexes_made == ("flowledger_events_notification_id_idx",)


def test_a_log_whose_events_table_was_dropped_is_refused_naming_it_and_not_made_anew(
    database_url: str, pg_schema: str
) -> None:
    # (An outside probe: `flowledger migrate` and every command on such a schema said only
    # 'relation "<schema>.flowledger_events" does not exist', exit 1.)
    # Given a migrated log whose events table was dropped in the database
    migrate(database_url, pg_schema)
    _drop(database_url, pg_schema, "DROP TABLE {s}.flowledger_events CASCADE")

    # When it is migrated, and an engine starts on it
    with pytest.raises(LogDamaged, match=r"flowledger_events is missing .* version \d+: the log was dropped"):
        migrate(database_url, pg_schema)
    with pytest.raises(LogDamaged, match=r"the log was dropped"):
        Engine(settings=make_settings(database_url=database_url, schema=pg_schema))

    # Then no empty log was made in its place
    with psycopg.connect(database_url, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{pg_schema}.flowledger_events",)).fetchone()
    assert found == (None,)
