"""An event row whose value was edited in the database so that it no longer folds into its
aggregate (a task's priority "urgent", its skills null, a step's context update a string) is
named by every load, stream and version: it raised a bare ValueError or TypeError out of
``get_task``, ``get_session`` and every write of them (HTTP 500 "internal error", naming
nothing). A value of the wrong type is named as the row is decoded (``sealing.py``); one of the
right type the aggregate cannot take (the priority), as the load folds it (``store.loaded``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.event_rows import chained_again


def _edit(database_url: str, schema: str, stream: UUID, version: int, edit: Callable[[Any], None]) -> None:
    """Change an event row's JSON in place, as someone with database access could."""
    table = Identifier(schema, "flowledger_events")
    where = SQL("WHERE originator_id = %s AND originator_version = %s")
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(SQL("SELECT state FROM {} {}").format(table, where), (stream, version)).fetchone()
        assert row is not None
        payload = json.loads(bytes(row[0]))
        edit(payload)
        update = SQL("UPDATE {} SET state = %s {}").format(table, where)
        conn.execute(update, (json.dumps(payload).encode(), stream, version))
    # Chained again under the key: a read by an engine that chains refuses an unsealed edit first
    chained_again(database_url, schema, stream, make_settings())


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("field", "value"),
    [("priority", "urgent"), ("required_skills", None), ("capacity_hint", None)],
)
def test_a_task_whose_creation_row_holds_a_value_it_cannot_take_is_named(
    database_url: str, pg_schema: str, field: str, value: object
) -> None:
    # Given a task whose Task.Created row was edited: a priority no enum has, skills null
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        engine.create_task("t1", "Fix the Go worker", ["golang"])
        stream = task_uuid(engine.tenant, "t1")
    if field == "capacity_hint":  # a field the event does not have: nothing to name
        _edit(database_url, pg_schema, stream, 1, lambda p: p.update({field: value}))
        with Engine(settings=settings) as engine:
            assert engine.get_task("t1").task_id == "t1"
        return
    _edit(database_url, pg_schema, stream, 1, lambda p: p.update({field: value}))
    # When a fresh engine reads it and assigns it, then both name the row
    with Engine(settings=settings) as engine:
        for call in (lambda: engine.get_task("t1"), lambda: engine.complete_task("t1", {"ok": True})):
            with pytest.raises(StoredEventUnreadable) as raised:
                call()
            assert (raised.value.stream, raised.value.version) == (str(stream), 1)
            assert "a stored event does not read back" in str(raised.value)
            if field == "priority":  # a text, as the field is: the fold meets it
                assert "does not fold into its aggregate: ValueError" in str(raised.value)


@pytest.mark.postgres
def test_a_session_whose_step_row_holds_a_value_it_cannot_take_is_named(
    database_url: str, pg_schema: str
) -> None:
    # Given a session whose third step's context update was edited into a string
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        engine.start_session("s-1", "cs")
        for n in range(4):
            engine.record_step("s-1", f"step-{n}", context_update={"n": n})
        stream = engine.session_uuid("s-1")
    _edit(database_url, pg_schema, stream, 4, lambda p: p.update({"context_update": "not a mapping"}))
    # When a fresh engine reads the session and records a step, then both name the row
    with Engine(settings=settings) as engine:
        for call in (lambda: engine.get_session("s-1"), lambda: engine.record_step("s-1", "after")):
            with pytest.raises(StoredEventUnreadable) as raised:
                call()
            assert (raised.value.stream, raised.value.version) == (str(stream), 4)
            assert "a stored event does not read back" in str(raised.value)
