"""Agent locks across engines: one engine holds an agent, another sees it taken and picks the
next best; each lock brings the agent's events newer than the version the engine knows,
read after the lock is held; the batch's append commits the locks away."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest

from flowledger.domain.agent import agent_uuid
from flowledger.domain.assignment import AgentProfile, Choice, choose_agent
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.agent_claims import CONTENDED_S
from flowledger.infrastructure.postgres import agent_locks
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.database import deadlines_of
from tests.conftest import make_settings


def locks_of(engine: Engine) -> AgentLocks:
    locks = engine._agent_locks
    assert locks is not None
    return locks


def outside_locks(engine: Engine, database_url: str, schema: str, table: str | None = None) -> AgentLocks:
    table = table or engine._app.recorder.events_table_name  # type: ignore[attr-defined]
    return AgentLocks(database_url, schema, table, deadlines_of(engine.settings))


def terminate(database_url: str, locks: AgentLocks) -> None:
    """End the locks' connection on the server, as an administrator or a failover would."""
    conn = locks._conn
    assert conn is not None
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [conn.info.backend_pid])


def fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == agent_locks.__name__ and r.levelno == logging.WARNING]


def test_a_lock_is_exclusive_across_engines_and_brings_the_agents_newer_events(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given an agent with two events, and a second engine on the same schema
    pg_engine.register_agent("be", "Backend", ["python"], 5)
    pg_engine.set_agent_capacity("be", 6)
    aggregate_id = agent_uuid(pg_engine.tenant, "be")
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        # When the first takes the lock, knowing version 1
        taken, elsewhere = locks_of(pg_engine).try_lock([(aggregate_id, 1)])
        # Then it holds it, with the event after version 1; the other cannot take it
        assert (taken, elsewhere) == ([aggregate_id], set())
        brought = locks_of(pg_engine).held[aggregate_id]
        assert brought is not None
        assert [e.originator_version for e in brought] == [2]
        assert locks_of(other).try_lock([(aggregate_id, 2)]) == ([], {aggregate_id})
        # Until its transaction ends
        locks_of(pg_engine).end()
        assert locks_of(other).try_lock([(aggregate_id, 2)]) == ([aggregate_id], set())
        assert locks_of(other).held[aggregate_id] == []
        locks_of(other).end()


def test_try_lock_takes_the_first_free_agents_in_the_order_given_and_no_more(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given three agents, the first held by another process
    ids = []
    for agent_id in ("a", "b", "c"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 5)
        ids.append(agent_uuid(pg_engine.tenant, agent_id))
    holder = outside_locks(pg_engine, database_url, pg_schema)
    third = outside_locks(pg_engine, database_url, pg_schema)
    try:
        assert holder.try_lock([(ids[0], 1)])[0] == [ids[0]]
        # When an engine wants one of the three, best first
        taken, elsewhere = locks_of(pg_engine).try_lock([(a, 1) for a in ids], wanted=1)
        # Then it took the second, knows the first is held elsewhere, and left the third free
        assert (taken, elsewhere) == ([ids[1]], {ids[0]})
        assert third.try_lock([(ids[2], 1)])[0] == [ids[2]]
    finally:
        locks_of(pg_engine).end()
        holder.close()
        third.close()


def test_an_assigner_takes_the_next_best_agent_when_another_process_holds_one(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given two equal agents, and another process holding one of them
    for agent_id in ("a", "b"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 5)
    pg_engine.create_task("t", "Fix it", ["python"])
    holder = outside_locks(pg_engine, database_url, pg_schema)
    try:
        assert holder.try_lock([(agent_uuid(pg_engine.tenant, "a"), 1)])[0]
        # When the task is assigned
        state = pg_engine.assign_task("t")
        # Then it went to the agent nobody held, without waiting and without a lost save
        assert state.agent_id == "b"
        assert pg_engine.store.conflicts == 0
    finally:
        holder.close()


def test_the_batch_append_commits_its_locks_away(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given one agent and a task
    pg_engine.register_agent("a", "a", ["python"], 5)
    pg_engine.create_task("t", "Fix it", ["python"])
    # When the task is assigned
    assert pg_engine.assign_task("t").agent_id == "a"
    # Then no transaction is left holding the agent: another process takes it at once
    assert locks_of(pg_engine).transaction is None
    other = outside_locks(pg_engine, database_url, pg_schema)
    try:
        assert other.try_lock([(agent_uuid(pg_engine.tenant, "a"), 1)])[0]
    finally:
        other.close()


def test_an_engine_with_a_stale_agent_decides_on_the_events_its_lock_brought_with_the_task(
    pg_engine: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a second engine that read the roster, then the first assigned the only agent a task
    pg_engine.register_agent("a", "a", ["python"], 2)
    for task_id in ("t1", "t2", "t3"):
        pg_engine.create_task(task_id, "Fix it", ["python"])
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        other.task_reads.index.refresh()
        assert pg_engine.assign_task("t1").agent_id == "a"
        with monkeypatch.context() as patched:
            patched.setattr(other.store, "events", lambda *a, **k: pytest.fail("read the agent again"))
            patched.setattr(other.store, "load", lambda *a, **k: pytest.fail("read the task apart"))
            # When the second assigns the next two, from its stale roster (load 0 of 2)
            second = other.tasks.assign_task("t2")
        third = other.tasks.assign_task("t3", escalate_when_full=False)
        # Then it saw the first assignment: no lost save, the agent full at 2, the third waits
        assert second.agent_id == "a"
        assert third.agent_id is None
        assert other.store.conflicts == 0
        assert pg_engine.get_agent("a").active_tasks == ("t1", "t2")
        # And the audit chain it wrote links on from the other engine's events
        assert verify_chain(other.audit).ok


def count_lock_calls(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    locks = locks_of(engine)
    try_lock = locks.try_lock

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return try_lock(*args, **kwargs)

    monkeypatch.setattr(locks, "try_lock", counted)
    return calls


def test_an_engine_alone_stops_taking_agent_locks_once_it_saw_nobody_else(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an engine alone with one agent and two tasks
    pg_engine.register_agent("a", "a", ["python"], 5)
    for task_id in ("t1", "t2"):
        pg_engine.create_task(task_id, "Fix it", ["python"])
    calls = count_lock_calls(pg_engine, monkeypatch)
    # When it assigns one (its first batch takes the locks), then another after a quiet spell
    pg_engine.assign_task("t1")
    assert len(calls) == 1
    time.sleep(CONTENDED_S + 0.1)
    state = pg_engine.assign_task("t2")
    # Then the second took no lock, and the agent holds both
    assert len(calls) == 1
    assert state.agent_id == "a"
    assert pg_engine.get_agent("a").active_tasks == ("t1", "t2")


def test_another_engines_assignments_in_the_log_turn_the_locks_back_on(
    pg_engine: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an engine that stopped taking locks
    pg_engine.register_agent("a", "a", ["python"], 5)
    for task_id in ("t1", "t2", "t3"):
        pg_engine.create_task(task_id, "Fix it", ["python"])
    pg_engine.assign_task("t1")
    time.sleep(CONTENDED_S + 0.1)
    calls = count_lock_calls(pg_engine, monkeypatch)
    # When another engine assigns, and the first reads the log
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        assert other.assign_task("t2").agent_id == "a"
    pg_engine.task_reads.index.refresh()
    state = pg_engine.assign_task("t3")
    # Then its next batch took the locks again, and lost no save
    assert len(calls) == 1
    assert state.agent_id == "a"
    assert pg_engine.store.conflicts == 0


def test_a_choice_among_the_agents_a_batch_holds_counts_every_eligible_agent_in_its_reason(
    pg_engine: Engine,
) -> None:
    # Given two equal agents, and an engine whose first batch locks only the agent it planned
    for agent_id in ("a", "b"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 4)
    pg_engine.create_task("t", "Fix it", ["python"])
    python = frozenset({"python"})
    profiles = [AgentProfile(agent_id=a, skills=python, capacity=4, load=0) for a in ("a", "b")]
    # When the task is assigned (chosen among the agents the batch holds first)
    state = pg_engine.assign_task("t")
    # Then the agent is the policy's choice over both, and the reason says both were eligible
    # (it said "least loaded of 1 eligible")
    expected = choose_agent("t", ["python"], profiles)
    assert isinstance(expected, Choice)
    assert state.agent_id == expected.agent_id
    assert state.assignment is not None
    assert "least loaded of the 1 considered first, 2 eligible in all" in state.assignment.reason


def test_a_lock_round_trip_brings_the_roster_up_to_date_with_every_agent_it_asked_about(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given a second engine that read the roster, then the first assigned a task to each agent
    for agent_id in ("a", "b"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 5)
    for task_id in ("t1", "t2", "t3"):
        pg_engine.create_task(task_id, "Fix it", ["python"])
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        other.task_reads.index.refresh()
        assert {pg_engine.assign_task(t).agent_id for t in ("t1", "t2")} == {"a", "b"}
        index = other.task_reads.index
        assert (index.agent_version("a"), index.agent_version("b")) == (1, 1)
        # When the second assigns the third (one lock taken, both agents asked about)
        chosen = other.assign_task("t3").agent_id
        # Then its roster caught up with the agent it did not take too, from the same read
        # (its next lock asks from there, and its log tail has nothing left to decode)
        left = "b" if chosen == "a" else "a"
        assert index.agent_version(left) == pg_engine.get_agent(left).version == 2
        assert index.agent_profile(left).load == 1
        assert other.store.conflicts == 0


def test_waiting_for_a_lock_holds_it_until_the_transaction_ends(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given an agent
    pg_engine.register_agent("a", "a", ["python"], 5)
    aggregate_id = agent_uuid(pg_engine.tenant, "a")
    other = outside_locks(pg_engine, database_url, pg_schema)
    try:
        # When an engine waits for its lock (no transaction open before)
        locks_of(pg_engine).lock(aggregate_id, 1)
        # Then it holds it, with the agent's newer events (none), until its transaction ends
        assert locks_of(pg_engine).held[aggregate_id] == []
        assert other.try_lock([(aggregate_id, 1)]) == ([], {aggregate_id})
        locks_of(pg_engine).end()
        assert other.try_lock([(aggregate_id, 1)])[0] == [aggregate_id]
    finally:
        locks_of(pg_engine).end()
        other.close()


def test_two_callers_asking_for_a_task_another_engine_created_share_one_batch_without_error(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given a task and an agent created by one engine, and a second engine that knows of the
    # task from the log but has never read it
    pg_engine.register_agent("a", "a", ["python"], 2)
    pg_engine.create_task("t1", "Fix it", ["python"])
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        other.task_reads.index.refresh()
        # When two of its callers ask for that task in one batch (two queue runs at once,
        # as two `POST /v1/queue/run` on one server: each lists the task)
        states = other.tasks.assigner.assign_all(["t1", "t1"], False)
        # Then the batch reads the task's stream once: it is assigned once, and answered once
        # (the second run's answer leaves out the task the first took: it counted it as its own)
        assert [s.agent_id for s in states] == ["a"]
        assert pg_engine.get_agent("a").active_tasks == ("t1",)
        assert [e.event_type for e in pg_engine.task_history("t1")] == ["Task.Created", "Task.Assigned"]


def test_a_broken_query_of_our_own_raises_and_leaves_no_lock_behind(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given an agent, and locks whose read after the lock names a table that does not exist
    # (a bug of ours, as a misspelt column or a wrong parameter type would be)
    pg_engine.register_agent("a", "a", ["python"], 5)
    aggregate_id = agent_uuid(pg_engine.tenant, "a")
    broken = outside_locks(pg_engine, database_url, pg_schema, table="no_such_events")
    other = outside_locks(pg_engine, database_url, pg_schema)
    try:
        # When they try to lock it, or wait for its lock
        # Then the error is raised (it used to be taken for an outage: the agent counted as
        # locked, events unknown), nothing counts as held and no fallback is counted
        with pytest.raises(psycopg.errors.UndefinedTable):
            broken.try_lock([(aggregate_id, 1)])
        with pytest.raises(psycopg.errors.UndefinedTable):
            broken.lock(aggregate_id, 1)
        assert broken.held == {}
        assert broken.fallbacks == 0
        # And the lock its first statement took went with the failed transaction
        assert other.try_lock([(aggregate_id, 1)]) == ([aggregate_id], set())
    finally:
        broken.close()
        other.close()


def test_an_assignment_whose_lock_connection_was_terminated_falls_back_and_assigns(
    pg_engine: Engine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an agent and a task, and the engine's lock connection ended on the server
    pg_engine.register_agent("a", "a", ["python"], 1)
    pg_engine.create_task("t1", "Fix it", ["python"])
    pg_engine.create_task("t2", "Fix it", ["python"])
    locks = locks_of(pg_engine)
    locks.try_lock([(agent_uuid(pg_engine.tenant, "a"), 1)])
    locks.end()
    terminate(database_url, locks)
    # When the engine's first batch (which takes the locks) assigns a task
    with caplog.at_level(logging.WARNING, logger=agent_locks.__name__):
        state = pg_engine.assign_task("t1")
    # Then it decided without the locks, said so once, and assigned as it would have
    assert locks.fallbacks == 1
    assert len(fallback_warnings(caplog)) == 1
    assert state.agent_id == "a"
    assert pg_engine.get_agent("a").active_tasks == ("t1",)
    assert pg_engine.store.conflicts == 0
    # And the agent's capacity still holds for the next task
    assert pg_engine.assign_task("t2", escalate_when_full=False).agent_id is None


def test_fallbacks_are_counted_each_and_warned_once_per_burst(
    pg_engine: Engine, database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an agent, and locks on a database nobody listens for
    pg_engine.register_agent("a", "a", ["python"], 5)
    aggregate_id = agent_uuid(pg_engine.tenant, "a")
    table = pg_engine._app.recorder.events_table_name  # type: ignore[attr-defined]
    unreachable = AgentLocks(
        "postgresql://postgres@127.0.0.1:1/test", pg_schema, table, deadlines_of(pg_engine.settings)
    )
    live = outside_locks(pg_engine, database_url, pg_schema)
    try:
        with caplog.at_level(logging.WARNING, logger=agent_locks.__name__):
            # When three lock calls in a row cannot reach it
            assert unreachable.try_lock([(aggregate_id, 1)]) == ([aggregate_id], set())
            unreachable.end()
            assert unreachable.try_lock([(aggregate_id, 1)]) == ([aggregate_id], set())
            unreachable.lock(aggregate_id, 1)
            # Then each counts, the agent counts as held with its events unknown, and one
            # warning covers them all
            assert unreachable.fallbacks == 3
            assert unreachable.held == {aggregate_id: None}
            assert len(fallback_warnings(caplog)) == 1
            # When another connection's calls fail, then work, then fail again
            live.try_lock([(aggregate_id, 1)])
            live.end()
            for _ in range(2):
                terminate(database_url, live)
                assert live.try_lock([(aggregate_id, 1)]) == ([aggregate_id], set())
                live.end()
                assert live.try_lock([(aggregate_id, 1)]) == ([aggregate_id], set())
                live.end()
        # Then each failure after a call that worked is a burst of its own, warned again
        assert live.fallbacks == 2
        assert len(fallback_warnings(caplog)) == 3
    finally:
        unreachable.close()
        live.close()


def test_a_lock_transaction_the_server_ended_for_idling_falls_back(
    pg_engine: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given locks whose transaction idles past the server's timeout while holding an agent
    # (psycopg raises this one as an InternalError, SQLSTATE 25P03, not an OperationalError)
    monkeypatch.setattr(agent_locks, "IDLE_S", 0.2)
    for agent_id in ("a", "b"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 5)
    a, b = (agent_uuid(pg_engine.tenant, agent_id) for agent_id in ("a", "b"))
    locks = outside_locks(pg_engine, database_url, pg_schema)
    try:
        assert locks.try_lock([(a, 1)])[0] == [a]
        time.sleep(0.6)
        # When it asks for another agent in that transaction
        taken = locks.try_lock([(b, 1)])
        # Then it decides without the locks rather than raise
        assert taken == ([b], set())
        assert locks.fallbacks == 1
        assert locks.transaction is None
    finally:
        locks.close()
