"""A snapshot is derived data: one changed in the database so that it no longer reads back
is passed over, and the aggregate is folded from its events, which are the record."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from tests.conftest import make_settings

DAMAGE = {
    "not JSON": "UPDATE {snapshots} SET state = convert_to('{{bad', 'UTF8')",
    "a topic no class has": "UPDATE {snapshots} SET topic = 'flowledger.domain.session:Nope'",
    "an empty payload": "UPDATE {snapshots} SET state = convert_to('{{}}', 'UTF8')",
    # Still JSON, one field of the state removed: it raised a bare AttributeError (HTTP 500)
    # from the session's state (status) or from applying the events after it (totals).
    **{
        f"the state's {field} removed": (
            "UPDATE {snapshots} SET state = convert_to((convert_from(state, 'UTF8')::jsonb"
            f" #- '{{{{state,{field}}}}}')::text, 'UTF8')"
        )
        for field in ("status", "totals", "history", "pending", "context")
    },
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_session_whose_snapshot_no_longer_reads_is_folded_from_its_events(
    database_url: str, pg_schema: str, damage: str
) -> None:
    # Given a session of 13 events with snapshots every 5, then its snapshots damaged (stored by
    # an engine that does not chain, so unsealed: a sealed snapshot edited without the key no
    # longer reads at all, tests/e2e/test_audit_snapshots.py; here the load meets the damage)
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=5, audit_chain=False
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s-1", "cs", user_id="u-1")
        for n in range(12):
            engine.record_step("s-1", f"step-{n}", context_update={"n": n})
        before = engine.get_session("s-1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL(DAMAGE[damage]).format(snapshots=Identifier(pg_schema, "flowledger_snapshots")))
    # When a fresh engine reads and writes the session (before: StoredEventUnreadable naming the
    # snapshot, with "`flowledger audit verify` checks every row", which does not check snapshots)
    with Engine(settings=settings) as engine:
        state = engine.get_session("s-1")
        record = engine.record_step("s-1", "after")
        # Then the state is the fold of its events, and the session goes on
        assert state == before
        assert (state.version, state.context) == (13, {"n": 11})
        assert record.version == 14
        assert engine.get_session("s-1", version=12).context == {"n": 10}
