"""A listing and a queue run read their tasks' events a batch at a time, not one task at a time:
``list_tasks(priority="high")`` over 1,501 tasks loaded each task with two round trips of its own
(8-11 s under load, 2.1-2.9 s on a quiet machine; a helper's outside probe). What they answer is
what ``get_task`` answers for each task, a damaged row included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from tests.conftest import make_settings
from tests.support.event_rows import chained_again

TASKS = 250  # past two of the listing's batches of 100


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """A router of 250 tasks, every tenth high, some assigned and one completed."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as writer:
        writer.register_agent("be", "Backend", ["golang"], capacity=5)
        for n in range(TASKS):
            writer.create_task(
                f"t{n:03}", "Fix the Go worker", ["golang"], priority="high" if n % 10 == 0 else "low"
            )
        for n in range(3):
            writer.assign_task(f"t{n:03}")
        writer.complete_task("t000", {"ok": True})
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as fresh:
        yield fresh


def _one_stream_reads(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every read of one stream's events the engine makes from now on."""
    recorder = engine.log._app.recorder
    assert isinstance(recorder, FlowledgerApplicationRecorder)
    reads: list[Any] = []
    original = recorder.select_events

    def counted(originator_id: Any, **kwargs: Any) -> Any:
        reads.append(originator_id)
        return original(originator_id, **kwargs)

    monkeypatch.setattr(recorder, "select_events", counted)
    return reads


def test_a_listing_reads_its_tasks_in_batches_and_answers_as_get_task(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _one_stream_reads(engine, monkeypatch)
    every = engine.list_tasks(limit=1000)
    high = engine.list_tasks(priority="high")
    page = engine.list_tasks(limit=7, after="t120")
    # No task was read alone (each was, twice over, before)
    assert {task_uuid(engine.tenant, f"t{n:03}") for n in range(TASKS)}.isdisjoint(reads)
    # And each answer is what get_task says of each task
    assert [t.task_id for t in every] == [f"t{n:03}" for n in range(TASKS)]
    assert every == [engine.get_task(t.task_id) for t in every]
    assert [t.task_id for t in high] == [f"t{n:03}" for n in range(0, TASKS, 10)]
    assert [t.task_id for t in page] == [f"t{n:03}" for n in range(121, 128)]
    assert [(t.task_id, t.status.value) for t in every[:4]] == [
        ("t000", "completed"),
        ("t001", "assigned"),
        ("t002", "assigned"),
        ("t003", "pending"),
    ]


def test_a_queue_run_reads_its_queue_in_batches(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _one_stream_reads(engine, monkeypatch)
    ran = engine.assign_pending(limit=3)
    # The agent had room for 3 more (capacity 5, two held): the three oldest waiting, high first
    assert [(t.task_id, t.agent_id) for t in ran] == [("t010", "be"), ("t020", "be"), ("t030", "be")]
    # The tasks were read in batches (the assignments' own writes read their task and agent)
    assert len(reads) <= 2 * len(ran)


def test_a_damaged_task_among_them_fails_the_listing_as_get_task_does(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given one assigned task's Assigned row edited so that it lacks its agent
    table = Identifier(pg_schema, "flowledger_events")
    stream = task_uuid(engine.tenant, "t002")
    where = SQL("WHERE originator_id = %s AND originator_version = 2")
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(SQL("SELECT state FROM {} {}").format(table, where), (stream,)).fetchone()
        assert row is not None
        payload = json.loads(bytes(row[0]))
        del payload["agent_id"]
        edited = json.dumps(payload).encode()
        conn.execute(SQL("UPDATE {} SET state = %s {}").format(table, where), (edited, stream))
    # (chained again under the key: a read by an engine that chains refuses an unsealed edit first)
    chained_again(database_url, pg_schema, stream, engine.settings)
    # When it is read alone and in a listing that reaches it, then both name the same row
    with pytest.raises(StoredEventUnreadable) as alone:
        engine.get_task("t002")
    with pytest.raises(StoredEventUnreadable) as listed:
        engine.list_tasks(limit=1000)
    assert (listed.value.stream, listed.value.version) == (alone.value.stream, alone.value.version)
    assert (alone.value.stream, alone.value.version) == (str(stream), 2)
    # And a listing that stops before it is answered
    assert [t.task_id for t in engine.list_tasks(limit=2)] == ["t000", "t001"]
