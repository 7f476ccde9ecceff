"""Every append path gets the plain append's protection of the log's id sequence: a sequence set
back below stored ids is set forward and the append tried again, and an id from a sequence cache
(refused by the append function) makes the recorder set ``CACHE 1`` again and try once more.

The plain path (an append in a pooled transaction of its own) had it alone. Outside probes, each
with the sequence altered under a running engine:
- the task assigner's append (in the transaction holding the agent locks): after ``setval(seq,
  1)`` on a log of 1,503 events, each of 193 appends collided with a stored id and was retried as
  a version clash until the operation deadline: ``StoreUnavailable`` after 33 s; after ``CACHE
  10`` the assignment was stored with ids from the cached block, and the sequence stayed at
  ``CACHE 10``;
- the tracking append (events with a tracking position, one transaction): ``IntegrityError`` on
  the duplicate id after ``setval``, ``OperationalError`` ("handed out a cached id") after a cache;
- group commit writes through the plain path's ``append_now`` (both survived the probe): its
  test keeps it so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent, Tracking
from eventsourcing.utils import Environment

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import library_env, migrate
from flowledger.infrastructure.postgres.factory import FlowledgerPostgresFactory, FlowledgerProcessRecorder
from flowledger.infrastructure.settings import Settings
from tests.conftest import make_settings
from tests.support.event_rows import notification_ids

pytestmark = pytest.mark.postgres

ALTERATIONS = {
    "set back": "SELECT setval({seq}, 1)",
    "cached": "ALTER SEQUENCE {name} CACHE 10",
}


def _alter(database_url: str, schema: str, alteration: str) -> None:
    sequence = f"{schema}.flowledger_events_notification_id_seq"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(ALTERATIONS[alteration].format(seq=f"'{sequence}'", name=sequence).encode())


def _sequence(database_url: str, schema: str) -> tuple[int, int]:
    """The sequence's cache size and last value."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT cache_size, last_value FROM pg_sequences WHERE schemaname = %s"
            " AND sequencename = 'flowledger_events_notification_id_seq'",
            (schema,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _sound(database_url: str, schema: str, stored_before: list[int], count: int) -> None:
    """``count`` events stored after ``stored_before``, each above every id stored before, and the
    sequence back at ``CACHE 1`` and at or past the highest stored id."""
    ids = notification_ids(database_url, schema)
    new = sorted(set(ids) - set(stored_before))
    assert len(ids) == len(set(ids)) == len(stored_before) + count
    assert min(new) > max(stored_before), (stored_before[-3:], new)
    cache, last = _sequence(database_url, schema)
    assert cache == 1
    assert last >= max(ids)


@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_group_commit_appends_after_the_sequence_was_altered_under_it(
    database_url: str, pg_schema: str, alteration: str
) -> None:
    # Given an engine with group commit writing a log of 41 events
    settings = make_settings(
        database_url=database_url, schema=pg_schema, group_commit=True, checkpoint_every_events=0
    )
    with Engine(settings=settings) as engine:
        for n in range(8):
            engine.start_session(f"s{n}", "wf")
        for n in range(33):
            engine.record_step(f"s{n % 8}", "answer", input={"n": n})
        before = notification_ids(database_url, pg_schema)

        # When the sequence is altered under it and eight threads save at once
        _alter(database_url, pg_schema, alteration)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: engine.record_step(f"s{n}", "after", input={"n": n}), range(8)))

    # Then every save is stored once, above every id stored before, and the sequence is sound
    _sound(database_url, pg_schema, before, 8)


@pytest.fixture
def process_recorder(database_url: str, pg_schema: str) -> Iterator[FlowledgerProcessRecorder]:
    migrate(database_url, pg_schema)
    env = library_env(database_url, schema=pg_schema, pool_size=4, settings=Settings())
    factory = FlowledgerPostgresFactory(Environment("flowledger", env))
    recorder = factory.process_recorder()
    assert isinstance(recorder, FlowledgerProcessRecorder)
    yield recorder
    factory.close()


def _event() -> StoredEvent:
    return StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t:E", state=b"{}")


@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_the_tracking_append_stores_after_the_sequence_was_altered_under_it(
    database_url: str, pg_schema: str, process_recorder: FlowledgerProcessRecorder, alteration: str
) -> None:
    # Given a log of 6 events written with tracking positions
    for position in range(1, 4):
        process_recorder.insert_events([_event(), _event()], tracking=Tracking("upstream", position))
    before = notification_ids(database_url, pg_schema)

    # When the sequence is altered and events are appended with the next tracking position
    _alter(database_url, pg_schema, alteration)
    ids = process_recorder.insert_events([_event(), _event()], tracking=Tracking("upstream", 4))

    # Then they are stored above every id stored before, the position moved, the sequence sound
    assert ids is not None
    assert len(ids) == 2
    _sound(database_url, pg_schema, before, 2)
    assert process_recorder.max_tracking_id("upstream") == 4


@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_the_assigners_append_under_agent_locks_stores_after_the_sequence_was_altered(
    database_url: str, pg_schema: str, alteration: str
) -> None:
    # Given a running engine with agents and 60 waiting tasks (agent locks on: the assigner's
    # append commits the transaction that holds them)
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    with Engine(settings=settings) as engine:
        engine.register_agent("ann", "Ann", ["billing"])
        engine.register_agent("bob", "Bob", ["billing"])
        for n in range(60):
            engine.create_task(f"t{n}", "refund please", required_skills=["billing"])
        before = notification_ids(database_url, pg_schema)

        # When the sequence is altered under it and a task is assigned
        _alter(database_url, pg_schema, alteration)
        state = engine.assign_task("t0")

        # Then it is assigned without a single version clash (each collision on a stored id was
        # retried as one: 193 of them, then StoreUnavailable, on a log of 1,503 events)
        assert state.status.value == "assigned", state
        assert engine.store.conflicts == 0
    # And its events are stored above every id stored before, and the sequence is sound
    _sound(database_url, pg_schema, before, 2)
