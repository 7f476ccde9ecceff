"""A schema named by an SQL reserved word (``order``, ``user``): a plain lower-case SQL name, so
the settings take it and ``migrate`` makes it, and engines must then start on it.

An outside probe (FLOWLEDGER_SCHEMA=order): ``flowledger migrate`` made the schema, then every
engine's start failed with "unexpected ProgrammingError (a bug in flowledger): syntax error at
or near "order"": the event library looked its row type up as ``order.stored_event_uuid``,
unquoted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from tests.conftest import make_settings
from tests.support.databases import BackgroundDrops

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def own_database(database_url: str, database_drops: BackgroundDrops) -> Iterator[str]:
    """A scratch database: a reserved word cannot carry the run's prefix, so the schema is made
    where no other run can meet it."""
    name = f"scratch_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(database_url)
    params["dbname"] = name
    yield make_conninfo(**params)
    database_drops.drop(database_url, name)


@pytest.mark.parametrize("schema", ["order", "user"])
def test_an_engine_starts_writes_and_reads_on_a_schema_named_by_a_reserved_word(
    own_database: str, schema: str
) -> None:
    # Given a schema named by a reserved word, made by migrate
    migrate(own_database, schema)

    # When an engine starts on it and records a step, then another engine reads it
    with Engine(settings=make_settings(database_url=own_database, schema=schema)) as engine:
        engine.start_session("s", "wf")
        engine.record_step("s", "answer", input={"q": 1}, output={"a": 2})
    with Engine(settings=make_settings(database_url=own_database, schema=schema)) as reader:
        session = reader.get_session("s")
        history = list(reader.history("s"))

    # Then both started, and the step reads back
    assert session.version == 2
    assert history[-1].event_type.endswith("StepProcessed")
