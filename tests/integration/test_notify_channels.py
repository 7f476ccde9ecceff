"""A follower hears only its own schema's appends: the LISTEN/NOTIFY channel names the schema.

It was named after the events table only, so the followers of two schemas in one database
(``flowledger projections follow`` of each) woke at each other's appends, each wake-up a read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.notify import channel_name
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


@pytest.fixture
def other_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """An engine of another schema in the same database (dropped with ``pg_schema``)."""
    with Engine(settings=make_settings(database_url=database_url, schema=f"{pg_schema}_b")) as engine:
        yield engine


def heard(conn: psycopg.Connection[Any]) -> int:
    return sum(1 for _ in conn.notifies(timeout=0.5, stop_after=1))


def test_a_follower_is_woken_by_appends_to_its_own_schema_only(
    pg_engine: Engine, other_engine: Engine, database_url: str
) -> None:
    # Given a connection listening on the channel of the first engine's schema
    channel = pg_engine.log.recorder.channel_name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL("LISTEN {}").format(Identifier(channel)))
        # When the other schema's engine appends, then this schema's
        other_engine.start_session("b", "wf")
        from_other = heard(conn)
        pg_engine.start_session("a", "wf")
        from_own = heard(conn)
    # Then only its own schema's append woke it
    assert (from_other, from_own) == (0, 1)


def test_a_channel_name_fits_postgresql_and_tells_long_schema_names_apart() -> None:
    long_a, long_b = "s" * 60 + "_a", "s" * 60 + "_b"
    names = {channel_name(schema, "flowledger_events") for schema in (long_a, long_b, "é" * 40)}
    assert len(names) == 3
    assert all(len(name.encode()) <= 63 for name in names)
    assert channel_name("tenant_a", "flowledger_events") == "tenant_a.flowledger_events"
