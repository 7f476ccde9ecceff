"""A routed assignment or queue run escalates a task past its deadline without classifying it
first: the escalation does not need what the task is, so the model is not paid to say it (it
was asked, then the task was escalated ``deadline_breached`` whatever it said). On both
backends, with a clock moved by hand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import TaskNeedsClassification
from flowledger.domain.task_views import TaskState, TaskStatus
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL
from tests.conftest import make_settings
from tests.support.clock import SetClock
from tests.support.llm import USAGE, ScriptedLlm

GO_BUG = json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})


@pytest.fixture(params=["memory", "postgres"])
def clocked(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, SetClock]]:
    """An engine on a clock the test moves, with a backend team and a model that classifies."""
    where: dict[str, object] = {"database_url": "memory:"}
    if request.param == "postgres":
        where = {
            "database_url": request.getfixturevalue("database_url"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    clock = SetClock(datetime(2026, 1, 5, 9, 0, tzinfo=UTC))
    with Engine(settings=make_settings(**where), clock=clock) as engine:
        engine.register_agent("backend", "Backend", ["python", "golang"], capacity=3)
        engine.llm = ScriptedLlm(GO_BUG, usage=USAGE)
        yield engine, clock


def _escalation(engine: Engine, task_id: str) -> tuple[TaskStatus, str | None]:
    state = engine.get_task(task_id)
    return state.status, state.escalation.reason if state.escalation else None


async def test_a_routed_assignment_escalates_an_overdue_task_without_classifying_it(
    clocked: tuple[Engine, SetClock],
) -> None:
    # Given a task naming no skills, never classified, whose deadline has passed
    engine, clock = clocked
    engine.create_task("t1", "Fix the race in the Go worker", deadline=timedelta(hours=1))
    clock.now += timedelta(hours=2)
    llm = engine.llm
    assert isinstance(llm, ScriptedLlm)

    # When it is assigned as REST and the CLI assign it
    state = await engine.assign_task_ranked("t1")

    # Then it is escalated for its deadline, and no model was paid to classify it
    assert (state.status, state.escalation.reason if state.escalation else None) == (
        TaskStatus.ESCALATED,
        "deadline_breached",
    )
    assert llm.calls == []
    assert [e.event_type for e in engine.task_history("t1")] == ["Task.Created", "Task.Escalated"]


async def test_a_routed_queue_run_escalates_an_overdue_task_without_classifying_it(
    clocked: tuple[Engine, SetClock],
) -> None:
    # Given an overdue task and a task in time, both naming no skills and never classified
    engine, clock = clocked
    engine.create_task("late", "Fix the race in the Go worker", deadline=timedelta(hours=1))
    engine.create_task("fresh", "Fix the Python importer", deadline=timedelta(days=2))
    clock.now += timedelta(hours=2)
    llm = engine.llm
    assert isinstance(llm, ScriptedLlm)

    # When the queue runs as REST and the CLI run it
    await engine.assign_pending_routed()

    # Then the overdue task is escalated unclassified, and only the other one is classified
    assert _escalation(engine, "late") == (TaskStatus.ESCALATED, "deadline_breached")
    assert [e.event_type for e in engine.task_history("late")] == ["Task.Created", "Task.Escalated"]
    assert len(llm.calls) == 1
    assert engine.get_task("fresh").status is TaskStatus.ASSIGNED


async def test_an_overdue_task_given_a_new_deadline_meanwhile_is_not_assigned_unclassified(
    clocked: tuple[Engine, SetClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an overdue task naming no skills, escalated and requeued with a new deadline by
    # another command just after the routed assignment read it (overdue, so not classified)
    engine, clock = clocked
    engine.create_task("t1", "Fix the race in the Go worker", deadline=timedelta(hours=1))
    clock.now += timedelta(hours=2)
    llm = engine.llm
    assert isinstance(llm, ScriptedLlm)
    read = engine.get_task

    def read_then_requeued(task_id: str) -> TaskState:
        state = read(task_id)
        engine.escalate_overdue()
        engine.requeue_task(task_id, "lead", "more time", deadline=timedelta(days=1))
        return state

    monkeypatch.setattr(engine, "get_task", read_then_requeued)

    # When the assignment goes on, then it refuses the task, never classified, rather than
    # give it to any agent with room; no model was called
    with pytest.raises(TaskNeedsClassification, match="past its deadline when looked at"):
        await engine.assign_task_ranked("t1")
    assert llm.calls == []
    assert engine.get_task("t1").status is TaskStatus.PENDING


async def test_a_routed_queue_run_without_a_model_escalates_an_overdue_unclassified_task(
    clocked: tuple[Engine, SetClock],
) -> None:
    # Given no model, and an overdue task naming no skills, never classified
    engine, clock = clocked
    engine.llm = None
    engine.create_task("late", "Fix the race in the Go worker", deadline=timedelta(hours=1))
    clock.now += timedelta(hours=2)

    # When the queue runs, then it is escalated for its deadline (it was held back, waiting
    # for a model to classify it, its deadline long passed)
    await engine.assign_pending_routed()
    assert _escalation(engine, "late") == (TaskStatus.ESCALATED, "deadline_breached")


def test_rest_does_not_say_an_overdue_task_waits_for_a_model_the_run_does_not_need(
    clocked: tuple[Engine, SetClock],
) -> None:
    # Given no model, an overdue task naming no skills, never classified, and one in time
    engine, clock = clocked
    engine.llm = None
    engine.create_task("late", "Fix the race in the Go worker", deadline=timedelta(hours=1))
    engine.create_task("fresh", "Fix the Python importer", deadline=timedelta(days=2))
    clock.now += timedelta(hours=2)
    with TestClient(create_app(engine)) as client:
        # When they are read over REST, then only the one in time is said to wait for a model
        # (the overdue one read held back "no model is configured to classify it", while the
        # queue run escalates it unclassified)
        held = {t: client.get(f"/v1/tasks/{t}").json()["held_back"] for t in ("late", "fresh")}
        assert held == {"late": None, "fresh": UNCLASSIFIED_NO_MODEL}
        ran = client.post("/v1/queue/run").json()
    assert {t["task_id"]: t["status"] for t in ran} == {"late": "escalated", "fresh": "pending"}
