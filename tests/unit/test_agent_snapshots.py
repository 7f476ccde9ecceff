"""An agent's snapshot stores the tasks it holds as two lists of text, not one object per task.

Each held task's accepted time went through the JSON transcoder as an object of its own: an
agent holding 1,800 tasks took 8.0 ms and 150 KB a snapshot (every 50 versions), the largest
part of an assigning process's interpreter time in ``bench_assignment.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from eventsourcing.domain import Snapshot as LibrarySnapshot
from psycopg.sql import SQL, Identifier

from flowledger.domain.agent import Agent, agent_uuid
from flowledger.domain.task_views import ReleaseOutcome
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.postgres.database import library_env
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from tests.conftest import make_settings
from tests.support.snapshot_rows import sealed_again, snapshot_json

AT = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)


def busy_agent(tasks: int) -> Agent:
    agent = Agent.register(agent_id="a-1", tenant="default", name="A", skills=["python"], capacity=10_000)
    for n in range(tasks):
        # accepted times in two time zones and with microseconds: each must come back exact
        zone = UTC if n % 2 else timezone(timedelta(hours=2))
        agent.accept(f"t-{n}", (AT + timedelta(microseconds=n * 1_001)).astimezone(zone))
    agent.release("t-0", ReleaseOutcome.COMPLETED, AT + timedelta(hours=1), 3600.0)
    agent.collect_events()
    return agent


def give_busy_tasks(engine: Engine, tasks: int) -> None:
    """Register agent "busy" (capacity 100) and assign it tasks ``t0``, ``t1``..."""
    engine.register_agent("busy", "Busy", ["python"], 100)
    for n in range(tasks):
        engine.create_task(f"t{n}", "work", ["python"])
        engine.assign_task(f"t{n}")


@pytest.fixture
def app() -> FlowledgerApplication:
    return FlowledgerApplication(library_env("memory:", schema="public", pool_size=1))


def test_a_snapshot_of_an_agent_holding_tasks_stores_them_as_two_lists_and_loads_them_exact(
    app: FlowledgerApplication,
) -> None:
    agent = busy_agent(1_800)
    # When its snapshot is stored and read back
    stored = app.mapper.to_stored_event(type(agent).Snapshot.take(agent))
    back = app.mapper.to_domain_event(stored).mutate(None)
    # Then the held tasks are two lists of text, not one encoded object per task
    state = json.loads(stored.state)["state"]
    assert len(state["active_ids"]) == len(state["active_at"]) == 1_799
    assert "active" not in state
    assert stored.state.count(b"_type_") < 10
    # And the agent comes back as it was: the same tasks, accepted at the same moments
    assert back.active == agent.active
    assert list(back.active) == list(agent.active)
    assert (back.load, back.completed, back.recent, back.version) == (1_799, 1, [3600.0], agent.version)


def test_an_agent_snapshot_stored_before_by_the_librarys_class_still_loads(
    app: FlowledgerApplication,
) -> None:
    # Given a snapshot in the library's own form (one transcoded object per held task)
    agent = busy_agent(20)
    stored = app.mapper.to_stored_event(LibrarySnapshot.take(agent))
    assert stored.topic == "eventsourcing.domain:Snapshot"
    # When it is read back, then the agent is as it was
    back = app.mapper.to_domain_event(stored).mutate(None)
    assert back.active == agent.active
    assert back.load == 19


@pytest.mark.parametrize("backend", ["memory", "postgres"])
def test_an_agent_reloaded_from_its_snapshots_equals_its_events_folded(
    backend: str, request: pytest.FixtureRequest
) -> None:
    url = "memory:" if backend == "memory" else request.getfixturevalue("database_url")
    schema = "public" if backend == "memory" else request.getfixturevalue("pg_schema")
    settings = make_settings(database_url=url, schema=schema, snapshot_interval=5)
    with Engine(settings=settings) as engine:
        give_busy_tasks(engine, 23)
        engine.complete_task("t0", {"n": 0})
        streams = engine.log.snapshotted_streams()
        assert agent_uuid(engine.tenant, "busy") in streams
        # Then every snapshot equals the agent's events folded to its version
        assert verify_snapshots(engine.log, streams) == []
    if backend == "postgres":
        with Engine(settings=settings) as fresh:
            # And a fresh engine (from the latest snapshot) reads the agent as the writer left it
            agent = fresh.get_agent("busy")
            assert (agent.load, agent.completed) == (22, 1)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda state: state.pop("active_ids"), id="held-task-ids-removed"),
        pytest.param(lambda state: state["active_at"].pop(), id="one-time-fewer-than-ids"),
        pytest.param(lambda state: state.pop("completed"), id="completed-count-removed"),
        pytest.param(lambda state: state.pop("recent"), id="recent-completions-removed"),
        pytest.param(
            lambda state: state["active_at"].__setitem__(0, "yesterday"), id="a-time-that-is-no-time"
        ),
    ],
)
def test_an_agent_whose_snapshot_was_edited_so_that_it_no_longer_reads_is_folded_from_its_events(
    database_url: str, pg_schema: str, damage: Callable[[dict[str, Any]], object]
) -> None:
    # (A snapshot without its held tasks raised a bare KeyError out of get_agent.)
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=5)
    with Engine(settings=settings) as engine:
        give_busy_tasks(engine, 12)
        # Given its snapshots edited so that they still parse as JSON, and sealed again with the
        # chain key (as an engine's own wrong snapshot would be: an edit without the key breaks
        # the seal, which tests/e2e/test_audit_snapshots.py covers)
        table = Identifier(pg_schema, "flowledger_snapshots")
        topic = "flowledger.domain.agent:Agent.Snapshot"
        with psycopg.connect(database_url, autocommit=True) as conn:
            rows = conn.execute(
                SQL("SELECT originator_id, originator_version, state FROM {} WHERE topic = %s").format(table),
                (topic,),
            ).fetchall()
            assert rows
            for stream, version, stored in rows:
                payload = snapshot_json(bytes(stored))
                damage(payload["state"])
                where = "WHERE originator_id = %s AND originator_version = %s"
                conn.execute(
                    SQL("UPDATE {} SET state = %s " + where).format(table),
                    (sealed_again(engine, stream, version, topic, payload), stream, version),
                )
    # When a fresh engine reads the agent, lists the roster (its task index reads each agent) and
    # completes a task, then the agent is folded from its events, as it was
    with Engine(settings=settings) as fresh:
        assert fresh.get_agent("busy").load == 12
        assert [(a.agent_id, a.load) for a in fresh.list_agents()] == [("busy", 12)]
        fresh.complete_task("t0", {"done": True})
        assert (fresh.get_agent("busy").load, fresh.get_agent("busy").completed) == (11, 1)
