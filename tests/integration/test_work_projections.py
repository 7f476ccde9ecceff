"""The task and agent rows of the current-state projection, folded from real commands.

Tasks and agents go through every transition (classified with a paid call, a paid call
discarded, assigned, started, completed, released, escalated, capacity changed); the rows
the projection folds incrementally, in small batches, must equal what is typed here, the
aggregates' own state, and a full rebuild.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql
from psycopg.rows import dict_row

from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, projector_for, rebuild, verify
from tests.support.llm import ScriptedLlm

pytestmark = pytest.mark.postgres

CLASSIFIED = json.dumps({"category": "feature", "complexity": "high", "estimated_hours": 6})
CALL = LlmUsage(
    provider="double", request_model="m", input_tokens=100, output_tokens=10, cost_usd=Decimal("0.25")
)


def rows(projector: Projector, table: str, key: str) -> dict[str, dict[str, Any]]:
    with projector.connect() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.SQL("SELECT * FROM {}.{}").format(
                sql.Identifier(projector.names.reader), sql.Identifier(table)
            )
        )
        return {row[key]: row for row in cur.fetchall()}


async def test_task_and_agent_rows_follow_every_transition_and_equal_a_rebuild(pg_engine: Engine) -> None:
    engine = pg_engine
    # Given two agents and five tasks taken through every kind of transition
    engine.register_agent("ana", "Ana", ["python", "sql"], 2)
    engine.register_agent("bo", "Bo", ["go"], 1)
    for task_id, skills in [
        ("t1", ["python"]),
        ("t2", ["go"]),
        ("t3", ["rust"]),
        ("t4", ["sql"]),
        ("t5", ["go"]),
    ]:
        engine.create_task(task_id, f"task {task_id}", skills, priority="high")
    engine.llm = ScriptedLlm(CLASSIFIED, usage=CALL)
    await engine.classify_task("t1")  # a paid classification: 0.25
    # t4: classified by hand while a paid call was in flight; the call's answer is discarded
    engine.llm = ScriptedLlm(
        CLASSIFIED, usage=CALL, meanwhile=lambda: engine.record_classification("t4", "review", "low", 1.0)
    )
    await engine.classify_task("t4")
    engine.assign_task("t1")  # ana
    engine.start_task("t1")
    engine.complete_task("t1", {"ok": True})
    engine.assign_task("t2")  # bo
    engine.release_task("t2", "handed back")
    engine.assign_task("t2")  # bo again
    engine.assign_task("t3")  # nobody knows rust: escalated
    engine.assign_task("t4")  # ana
    engine.assign_task("t5")  # bo is full: escalated
    engine.set_agent_capacity("bo", 3)

    # When the projection folds the log in batches of three
    projector = projector_for(engine, batch_size=3)
    projector.catch_up()
    tasks, agents = rows(projector, "tasks", "task_id"), rows(projector, "agents", "agent_id")

    # Then each row is what the commands did (typed here)
    expected_tasks = {
        "t1": ("completed", "ana", 1, Decimal("0.25"), "feature"),  # the row keeps who did it
        "t2": ("assigned", "bo", 2, Decimal("0"), None),
        "t3": ("escalated", None, 0, Decimal("0"), None),
        "t4": ("assigned", "ana", 1, Decimal("0.25"), "review"),
        "t5": ("escalated", None, 0, Decimal("0"), None),
    }
    got_tasks = {
        t: (r["status"], r["agent_id"], r["times_assigned"], r["cost_usd"], r["category"])
        for t, r in tasks.items()
    }
    assert got_tasks == expected_tasks
    assert tasks["t3"]["escalation_reason"] == "no_capable_agent"
    assert tasks["t5"]["escalation_reason"] == "all_at_capacity"
    assert tasks["t1"]["started_at"] is not None
    assert tasks["t1"]["completed_at"] is not None
    got_agents = {a: (r["capacity"], r["load"], r["active_tasks"], r["completed"]) for a, r in agents.items()}
    assert got_agents == {"ana": (2, 1, ["t4"], 1), "bo": (3, 1, ["t2"], 0)}

    # And agrees with the aggregates' own state, version for version
    for task_id, row in tasks.items():
        state = engine.get_task(task_id)
        assert (row["status"], row["version"]) == (state.status.value, state.version)
        if state.status.holds_agent:
            assert row["agent_id"] == state.agent_id
    for agent_id, row in agents.items():
        agent = engine.get_agent(agent_id)
        assert (row["load"], row["version"]) == (agent.load, agent.version)
        assert sorted(agent.active_tasks) == row["active_tasks"]

    # And a full rebuild gives the same rows; verify finds no difference
    rebuild(projector_for(engine, batch_size=1000))
    assert rows(projector, "tasks", "task_id") == tasks
    assert rows(projector, "agents", "agent_id") == agents
    assert verify(projector) == []


def test_a_requeued_task_row_takes_the_new_deadline_and_drops_the_escalation(pg_engine: Engine) -> None:
    # Given a task escalated for its passed deadline, requeued with a new one and assigned
    engine = pg_engine
    engine.register_agent("ana", "Ana", ["python"], 2)
    engine.create_task("t", "Fix", ["python"], deadline=datetime.now(UTC) - timedelta(hours=1))
    assert engine.escalate_overdue()[0].task_id == "t"
    requeued = engine.requeue_task("t", "alice@example.com", "try again", timedelta(hours=8))
    # Then the task's own state no longer says it is escalated, in the queue or once assigned
    assert requeued.escalation is None
    assigned = engine.assign_task("t")
    assert (assigned.status.value, assigned.escalation) == ("assigned", None)
    # And the projection's row has the new deadline and no escalation reason
    projector = projector_for(engine, batch_size=3)
    projector.catch_up()
    row = rows(projector, "tasks", "task_id")["t"]
    assert (row["status"], row["deadline"], row["escalation_reason"]) == ("assigned", requeued.deadline, None)
    # And the history still says why it was escalated
    assert engine.task_history("t")[2].data["escalation_reason"] == "deadline_breached"


async def test_a_sessions_and_a_tasks_cost_count_what_their_retried_attempts_were_billed(
    pg_engine: Engine,
) -> None:
    """The current-state rows' ``cost_usd`` added each call's answer only: a session whose one
    call cost $0.01 after a retried attempt billed $0.02 read 0.03 in its state's totals (and
    on the cost dashboard) but 0.01 in its ``sessions`` row, and a task's row likewise."""
    engine = pg_engine
    retried = LlmUsage(
        provider="double",
        request_model="m",
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal("0.01"),
        retried_cost_usd=Decimal("0.02"),
    )
    # Given a session step and a task classification, each a call with a billed retry
    engine.start_session("s-retried", "wf")
    engine.record_step("s-retried", "greet", usage=retried)
    engine.create_task("t-retried", "task", ["python"], priority="high")
    engine.llm = ScriptedLlm(CLASSIFIED, usage=retried)
    await engine.classify_task("t-retried")
    # When the projection is caught up
    projector = projector_for(engine)
    projector.catch_up()
    # Then both rows count the answer and the retried attempt, as the session's totals do
    assert engine.get_session("s-retried").totals.cost_usd == Decimal("0.03")
    assert rows(projector, "sessions", "session_id")["s-retried"]["cost_usd"] == Decimal("0.03")
    assert rows(projector, "tasks", "task_id")["t-retried"]["cost_usd"] == Decimal("0.03")
