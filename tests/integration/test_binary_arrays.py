"""A several-event append's arrays in PostgreSQL's binary form (``binary_arrays.py``): the
server reads back exactly the values given, NULLs included, and an append through them
stores what psycopg's list dumping stored, ids and audit chain included."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres import binary_arrays
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


def event(stream: uuid.UUID | str, version: int, topic: str = "bench:Step") -> StoredEvent:
    return StoredEvent(
        originator_id=stream, originator_version=version, topic=topic, state=b'{"v": %d}' % version
    )


def test_the_server_reads_each_array_as_given(database_url: str) -> None:
    events = [
        event(uuid.uuid4(), 1, "a:Ü"),  # non-ASCII topic: text goes as UTF-8
        event(uuid.uuid4(), 2**40, "b:B"),  # beyond 32 bits
        event(uuid.UUID(int=0), 7, "c:C"),
    ]
    hashes = [b"\x00\x01", None, b""]  # a NULL and an empty value are different things
    arrays = binary_arrays.append_arrays(events, hashes, [None, None, None])
    assert arrays is not None
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT %s::uuid[], %s::bigint[], %s::text[], %s::bytea[], %s::bytea[], %s::bytea[]", arrays
        ).fetchone()
    assert row is not None
    ids, versions, topics, states, sent_hashes, sent_macs = row
    assert ids == [e.originator_id for e in events]
    assert versions == [1, 2**40, 7]
    assert topics == ["a:Ü", "b:B", "c:C"]
    assert [bytes(s) for s in states] == [e.state for e in events]
    assert [None if h is None else bytes(h) for h in sent_hashes] == hashes
    assert sent_macs == [None, None, None]


def test_text_ids_keep_psycopgs_list_dumping() -> None:
    events = [event("session-1", 1), event(uuid.uuid4(), 1)]
    assert binary_arrays.append_arrays(events, [None] * 2, [None] * 2) is None


def test_several_events_appended_through_the_arrays_store_what_was_given(pg_engine: Engine) -> None:
    recorder = pg_engine.log.recorder
    first, second = uuid.uuid4(), uuid.uuid4()
    ids = recorder.insert_events([event(first, 1), event(second, 1), event(first, 2)])
    assert ids is not None
    assert len(ids) == 3
    assert sorted(ids) == list(ids)
    assert [(e.originator_version, e.topic, e.state) for e in recorder.select_events(first)] == [
        (1, "bench:Step", b'{"v": 1}'),
        (2, "bench:Step", b'{"v": 2}'),
    ]
    assert [e.originator_version for e in recorder.select_events(second)] == [1]
    # A clash on any one stream stores none of the batch.
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(second, 2), event(first, 2)])
    assert [e.originator_version for e in recorder.select_events(second)] == [1]
    pg_engine.audit.checkpoint()
    report = verify_chain(pg_engine.audit)
    assert report.ok, report.findings


def test_an_assignment_batch_saves_through_the_arrays(database_url: str, pg_schema: str) -> None:
    # Without agent locks: a batch under them appends in their transaction, in one query
    # string of its own (``literal_append.py``, tests/integration/test_literal_append.py).
    settings = make_settings(database_url=database_url, schema=pg_schema, agent_locks=False)
    with Engine(settings=settings) as engine:
        assert_assigned_through_the_arrays(engine)


def assert_assigned_through_the_arrays(pg_engine: Engine) -> None:
    recorder = pg_engine.log.recorder
    real = recorder.encode_arrays
    assert real is binary_arrays.append_arrays
    sent: list[bool] = []

    def counted(*args: Any) -> tuple[binary_arrays.BinaryArray, ...] | None:
        found = real(*args)
        sent.append(found is not None)
        return found

    pg_engine.register_agent("a-1", "Agent", ["python"], 5)
    pg_engine.create_task("t-1", "work", ["python"], "medium")
    recorder.encode_arrays = counted
    try:
        state = pg_engine.assign_task("t-1")
    finally:
        recorder.encode_arrays = real
    assert state.agent_id == "a-1"
    assert sent  # the task's and the agent's events went as binary arrays
    assert all(sent)
    assert pg_engine.get_agent("a-1").active_tasks == ("t-1",)
