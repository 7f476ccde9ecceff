"""A row changed in the database so that it no longer reads back is named, over HTTP and in
the projections' dead letters, as the CLI names it: not an "internal error"."""

from __future__ import annotations

import psycopg
from fastapi.testclient import TestClient
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for, recent_dead_letters
from tests.support.event_rows import chained_again

LONE_SURROGATE = (
    "UPDATE {events} SET state = convert_to(replace(convert_from(state, 'UTF8'),"
    " '\"greet\"', '\"gr' || chr(92) || 'ud800eet\"'), 'UTF8')"
    " WHERE originator_id = %s AND originator_version = 2"
)


def test_a_stored_lone_surrogate_is_named_as_a_damaged_row(pg_engine: Engine) -> None:
    # Given a step whose stored name was given an escaped lone surrogate in the database
    pg_engine.start_session("victim", "cs")
    pg_engine.record_step("victim", "greet")
    with psycopg.connect(pg_engine.database_url, autocommit=True) as conn:
        events = Identifier(pg_engine.settings.schema, "flowledger_events")
        conn.execute(SQL(LONE_SURROGATE).format(events=events), [pg_engine.session_uuid("victim")])
    # (chained again under the key: a read by an engine that chains refuses an unsealed edit first)
    chained_again(
        pg_engine.database_url,
        pg_engine.settings.schema,
        pg_engine.session_uuid("victim"),
        pg_engine.settings,
    )
    # When it is read over HTTP, Then the answer names the row (it was "internal error")
    with TestClient(create_app(pg_engine)) as client:
        response = client.get("/v1/sessions/victim/history")
    assert response.status_code == 500
    error = response.json()["error"]
    assert "does not read back" in error
    assert "version 2" in error
    assert "lone surrogate (\\ud800)" in error
    # And each projection sets the event aside with the same words (it was a UnicodeEncodeError)
    projector = projector_for(pg_engine)
    projector.catch_up()
    letters = recent_dead_letters(projector)
    assert letters
    assert all("lone surrogate" in letter.error for letter in letters)
