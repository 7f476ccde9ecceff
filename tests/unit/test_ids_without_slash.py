"""Session, task and agent ids cannot hold ``/`` (REST and the CLI's users address them in URL
paths, where ``%2F`` is decoded before routing): the engine refuses one when the session,
task or agent is created, and still loads and works on those stored before the rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain.agent import Agent
from flowledger.domain.errors import SessionNotFound, TaskNotFound, ValidationError
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine


@pytest.mark.parametrize(
    ("bad", "why"), [("ops/1", "'/'"), ("/", "'/'"), ("a/b/c", "'/'"), (".", "dots"), ("..", "dots")]
)
def test_creating_a_session_task_or_agent_with_a_slash_in_its_id_is_refused(
    engine: Engine, bad: str, why: str
) -> None:
    # ("." and ".." too: clients resolve them away, /v1/tasks/. is the task list)
    # When each kind of id is created holding "/"
    engine.start_session("s-1", "w")
    attempts = {
        "task_id": lambda: engine.create_task(bad, "Fix it"),
        "agent_id": lambda: engine.register_agent(bad, "Ops", ["python"]),
        "session_id": lambda: engine.start_session(bad, "w"),
        "new_session_id": lambda: engine.fork_session("s-1", 1, bad),
    }
    for field, attempt in attempts.items():
        # Then it is refused, naming the field and the character
        with pytest.raises(ValidationError, match=why) as raised:
            attempt()
        assert raised.value.field == field
    # And nothing was recorded
    with pytest.raises(TaskNotFound):
        engine.get_task(bad)
    assert engine.list_agents() == []
    with pytest.raises(SessionNotFound):
        engine.get_session(bad)


def test_ids_with_a_slash_stored_before_the_rule_still_load_and_work(engine: Engine) -> None:
    # Given a session, an agent and a task whose ids hold "/", written before the rule existed
    # (their created events, built without the public commands' checks)
    tenant, soon = engine.tenant, datetime.now(UTC) + timedelta(hours=1)
    engine.store.app.save(
        Session(session_id="u/1", tenant=tenant, workflow="w", user_id=None, expires_at=soon, metadata={}),
        Agent(agent_id="ops/be", tenant=tenant, name="Ops", skills=["python"], capacity=1),
        Task(
            task_id="ops/1",
            tenant=tenant,
            description="Fix it",
            required_skills=["python"],
            priority="medium",
            deadline=soon,
        ),
    )
    # When they are read and worked on now
    assert engine.get_session("u/1").session_id == "u/1"
    engine.record_step("u/1", "greet", {"message": "hi"}, {"reply": "hello"})
    assert engine.get_session("u/1").step_count == 1
    assert engine.assign_task("ops/1").agent_id == "ops/be"
    done = engine.complete_task("ops/1", {"pr": 1})
    # Then every command worked on the stored ids, and the agent's slot is free again
    assert done.status is TaskStatus.COMPLETED
    assert engine.get_agent("ops/be").load == 0
    assert [e.event_type for e in engine.task_history("ops/1")][-1] == "Task.Completed"
