"""The notification-id sequence must hand out ids above every stored one: a reader that passed an
id never goes back, so an event stored under a lower id is never delivered to it.

Outside probes, each on a log of a few events, the sequence altered by an operator:
- ``setval`` backwards (below ids taken by rolled-back appends, which leave gaps): the next
  events filled the gaps, below ids readers had passed, and nothing said so, at an engine's
  start either;
- ``MAXVALUE <last> CYCLE``: the sequence went back to 1, and every append collided with a
  stored id: "'s1' was changed concurrently 65 times in a row" (``ConcurrentUpdate``);
- ``setval`` backwards or ``INCREMENT BY -1`` while engines ran: each append collided with a
  stored id and was retried as a version clash, 64 times, then ``ConcurrentUpdate``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import migrate
from tests.conftest import make_settings
from tests.support.event_rows import notification_ids

pytestmark = pytest.mark.postgres


def _sql(database_url: str, statement: str, schema: str) -> list[tuple[object, ...]]:
    sequence = f"{schema}.flowledger_events_notification_id_seq"
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(statement.format(seq=f"'{sequence}'", name=sequence).encode())
        return cur.fetchall() if cur.description else []


@pytest.fixture
def engine_of(database_url: str, pg_schema: str) -> Iterator[Engine]:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    yield engine
    engine.close()


def _steps(engine: Engine, session: str, count: int) -> None:
    engine.start_session(session, "wf")
    for n in range(count):
        engine.record_step(session, "answer", input={"n": n})


def test_an_engine_started_after_the_sequence_was_set_back_into_gaps_stores_above_every_id(
    database_url: str, pg_schema: str, engine_of: Engine
) -> None:
    # Given a log with a gap in its ids (taken by appends that rolled back), the sequence set back into it
    _steps(engine_of, "a", 3)
    _sql(database_url, "SELECT nextval({seq}) FROM generate_series(1, 5)", pg_schema)
    _steps(engine_of, "b", 3)
    engine_of.close()
    highest = max(notification_ids(database_url, pg_schema))
    _sql(database_url, "SELECT setval({seq}, 5)", pg_schema)

    # When an engine starts and writes
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        _steps(engine, "c", 2)

    # Then the new events are stored above every id stored before
    ids = notification_ids(database_url, pg_schema)
    assert len(ids) == 11
    assert min(ids[-3:]) > highest, ids


def test_migrate_turns_a_cycling_or_descending_sequence_back_into_an_ascending_one(
    database_url: str, pg_schema: str, engine_of: Engine
) -> None:
    # Given a log whose sequence was made to cycle at its last id, and to count down
    _steps(engine_of, "a", 3)
    engine_of.close()
    _sql(database_url, "ALTER SEQUENCE {name} MAXVALUE 4 CYCLE INCREMENT BY -1", pg_schema)

    # When it is migrated, and an engine writes
    report = migrate(database_url, pg_schema)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        _steps(engine, "b", 1)

    # Then the sequence counts up without end, and the new events follow the old
    assert report.locked
    assert "increment -1 set to 1" in report.sequence_repairs
    assert "cycle turned off" in report.sequence_repairs
    shape = _sql(
        database_url,
        "SELECT seqincrement, seqcycle FROM pg_sequence WHERE seqrelid = {seq}::regclass",
        pg_schema,
    )
    assert shape == [(1, False)]
    assert notification_ids(database_url, pg_schema) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("alteration", ["SELECT setval({seq}, 1)", "ALTER SEQUENCE {name} INCREMENT BY -1"])
def test_an_engine_whose_sequence_is_set_back_while_it_runs_stores_above_every_id(
    database_url: str, pg_schema: str, engine_of: Engine, alteration: str
) -> None:
    # Given a running engine and a log of 70 events
    _steps(engine_of, "a", 69)

    # When the sequence is set back under it, and it goes on writing
    _sql(database_url, alteration, pg_schema)
    engine_of.record_step("a", "answer", input={"n": "after"})
    engine_of.record_step("a", "answer", input={"n": "after again"})

    # Then both steps are stored above every id, in order
    assert notification_ids(database_url, pg_schema) == list(range(1, 73))
    shape = _sql(
        database_url, "SELECT seqincrement FROM pg_sequence WHERE seqrelid = {seq}::regclass", pg_schema
    )
    assert shape == [(1,)]
