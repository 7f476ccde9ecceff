"""An event row edited in the database so that it is still JSON but one of its values is not of
its field's type (a context update that is no object, a step name that is a number) is bad data:
every load of the stream names the row as ``StoredEventUnreadable``, never a bare TypeError or a
state holding the wrong type."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain import StoredEventUnreadable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.event_rows import chained_again

DAMAGE = {
    # Each raised a bare TypeError or AttributeError out of get_session and record_step (HTTP 500)
    "a context update that is a list": "'{context_update}', '[1]'",
    "a context update that is a string": "'{context_update}', '\"x\"'",
    "an idempotency key that is a number": "'{idempotency_key}', '1'",
    # Each read back as it was: the step's name a number in the session's history, and HTTP
    # GET /v1/sessions/{id} then a 500 (the response model refused it)
    "a step name that is a number": "'{step}', '5'",
    "a next step that is an object": "'{next_step}', '{}'",
    "an input that is a list": "'{input}', '[1]'",
}


@pytest.mark.parametrize("snapshot_interval", [3, 50], ids=["after a snapshot", "no snapshot"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_stored_value_that_does_not_fold_names_its_row(
    database_url: str, pg_schema: str, damage: str, snapshot_interval: int
) -> None:
    # Given a session of five events (a snapshot at version 3 or none), version 4 edited
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=snapshot_interval)
    with Engine(settings=settings) as engine:
        engine.start_session("s-1", "cs", user_id="u-1")
        for n in range(4):
            engine.record_step("s-1", f"step-{n}", context_update={"n": n}, idempotency_key=f"k-{n}")
        stream = engine.session_uuid("s-1")
    edit = SQL(
        "UPDATE {} SET state = convert_to(jsonb_set(convert_from(state, 'UTF8')::jsonb, "
        + DAMAGE[damage].replace("{", "{{").replace("}", "}}")
        + ")::text, 'UTF8') WHERE originator_id = %s AND originator_version = 4"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(edit.format(Identifier(pg_schema, "flowledger_events")), (stream,))
    # (chained again under the key: a read by an engine that chains refuses an unsealed edit first)
    chained_again(database_url, pg_schema, stream, settings)
    # When a fresh engine reads the session, at its head and at the edited version, and writes it
    with Engine(settings=settings) as engine:
        for call in (
            lambda: engine.get_session("s-1"),
            lambda: engine.get_session("s-1", version=4),
            lambda: engine.record_step("s-1", "after"),
        ):
            # Then each names the edited row
            with pytest.raises(StoredEventUnreadable) as raised:
                call()
            assert (raised.value.stream, raised.value.version) == (str(stream), 4)
        # And the versions before it still read
        assert engine.get_session("s-1", version=3).context == {"n": 1}
