"""Agent locks across engines: one engine holds an agent, another sees it taken and picks the
next best; each lock comes with the agent's stored version, read after the lock is held."""

from __future__ import annotations

from flowledger.domain.agent import agent_uuid
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.database import deadlines_of
from tests.conftest import make_settings


def locks_of(engine: Engine) -> AgentLocks:
    locks = engine._agent_locks
    assert locks is not None
    return locks


def test_a_lock_is_exclusive_across_engines_and_reports_the_stored_version(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given an agent with a few events, and a second engine on the same schema
    pg_engine.register_agent("be", "Backend", ["python"], 5)
    pg_engine.set_agent_capacity("be", 6)
    aggregate_id = agent_uuid(pg_engine.tenant, "be")
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        # When the first takes the lock
        got, version = locks_of(pg_engine).try_lock(aggregate_id)
        # Then it holds it, knowing the agent's last version; the other cannot take it
        assert (got, version) == (True, 2)
        assert locks_of(other).try_lock(aggregate_id) == (False, 2)
        locks_of(pg_engine).release_all()
        assert locks_of(other).try_lock(aggregate_id) == (True, 2)
        locks_of(other).release_all()


def test_an_assigner_takes_the_next_best_agent_when_another_process_holds_one(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given two equal agents, and another process holding one of them
    for agent_id in ("a", "b"):
        pg_engine.register_agent(agent_id, agent_id, ["python"], 5)
    pg_engine.create_task("t", "Fix it", ["python"])
    table = pg_engine._app.recorder.events_table_name  # type: ignore[attr-defined]
    holder = AgentLocks(database_url, pg_schema, table, deadlines_of(pg_engine.settings))
    try:
        assert holder.try_lock(agent_uuid(pg_engine.tenant, "a"))[0]
        # When the task is assigned
        state = pg_engine.assign_task("t")
        # Then it went to the agent nobody held, without waiting and without a lost save
        assert state.agent_id == "b"
        assert pg_engine.store.conflicts == 0
    finally:
        holder.close()
