"""A task whose classification failed, and that names no skills, waits for a reclassification:
the queue passes it over (saying why) and a direct assignment is refused, on both backends.
A task never classified keeps the documented rule (it may go to any agent with room)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import TaskNeedsClassification, TaskTransitionRejected
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm

MALFORMED = "this is not a classification"
GO_BUG = json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})


def teams(engine: Engine) -> None:
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"], capacity=1)
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"], capacity=1)


async def test_the_queue_passes_over_a_task_whose_classification_failed(engine: Engine) -> None:
    # Given the issue's own example: a task without skills whose classification failed twice
    engine.llm = ScriptedLlm(MALFORMED)
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", priority="critical")
    failed = await engine.classify_task("T-1")
    history = [entry.event_type for entry in engine.task_history("T-1")]
    assert history == ["Task.Created", "Task.ClassificationFailed", "Task.ClassificationFailed"]
    assert failed.status is TaskStatus.PENDING
    assert failed.held_back is not None

    # When the queue runs
    (offered,) = engine.assign_pending()

    # Then it is not given to just anyone: it waits, and the run says why
    assert offered.task_id == "T-1"
    assert offered.status is TaskStatus.PENDING
    assert offered.assignment is None
    assert offered.held_back is not None
    assert "reclassify" in offered.held_back
    assert [entry.event_type for entry in engine.task_history("T-1")] == history
    assert engine.get_agent("devops").load == 0


async def test_a_held_back_task_does_not_use_up_a_limited_queue_run(engine: Engine) -> None:
    # Given a critical task held back (its classification failed) and a low one that can be placed
    engine.llm = ScriptedLlm(MALFORMED)
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", priority="critical")
    assert (await engine.classify_task("T-1")).held_back is not None
    engine.create_task("T-2", "Rotate the keys", ["aws"], priority="low")

    # When the queue runs one task at a time
    ran = engine.assign_pending(limit=1)

    # Then the held-back task is passed over without taking the one place: the low task is
    # assigned (every run with limit=1 offered the held-back task alone, so none was ever placed)
    assert [(s.task_id, s.status) for s in ran] == [("T-1", TaskStatus.PENDING), ("T-2", TaskStatus.ASSIGNED)]
    assert engine.get_task("T-2").agent_id == "devops"
    # And a run that has no other task to offer still says why the held-back one waits
    (again,) = engine.assign_pending(limit=1)
    assert (again.task_id, again.held_back is not None) == ("T-1", True)


async def test_assigning_a_task_whose_classification_failed_is_refused(engine: Engine) -> None:
    engine.llm = ScriptedLlm(MALFORMED)
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", priority="critical")
    await engine.classify_task("T-1")
    before = engine.task_history("T-1")

    with pytest.raises(TaskNeedsClassification) as refused:
        engine.assign_task("T-1")

    assert isinstance(refused.value, TaskTransitionRejected)  # a 409, exit 4
    assert refused.value.task_id == "T-1"
    assert "reclassify" in str(refused.value)
    assert engine.task_history("T-1") == before


async def test_a_reclassified_task_is_routed_by_its_classification(engine: Engine) -> None:
    # Given a task whose classification failed, then succeeded on a reclassification
    engine.llm = ScriptedLlm(MALFORMED)
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", priority="critical")
    await engine.classify_task("T-1")
    engine.llm = ScriptedLlm(GO_BUG)
    reclassified = await engine.reclassify_task("T-1")
    assert reclassified.held_back is None

    # When the queue runs, it goes to the team whose skills fit
    (assigned,) = engine.assign_pending()
    assert assigned.agent_id == "backend"


async def test_a_task_with_skills_of_its_own_is_assigned_though_its_classification_failed(
    engine: Engine,
) -> None:
    engine.llm = ScriptedLlm(MALFORMED)
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", ["golang"], priority="critical")
    held = await engine.classify_task("T-1")
    assert held.held_back is None
    assert engine.assign_task("T-1").agent_id == "backend"


def test_a_task_never_classified_may_still_go_to_any_agent(engine: Engine) -> None:
    teams(engine)
    engine.create_task("T-1", "Fix the race in the Go worker", priority="critical")
    (assigned,) = engine.assign_pending()
    assert assigned.status is TaskStatus.ASSIGNED
    assert assigned.held_back is None


def test_over_rest_the_queue_run_says_why_and_an_assignment_is_a_409() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"), llm=ScriptedLlm(MALFORMED))
    with TestClient(create_app(engine)) as http:
        for agent_id, skills in (("backend", ["python", "golang"]), ("devops", ["docker"])):
            body = {"agent_id": agent_id, "name": agent_id, "skills": skills, "capacity": 1}
            assert http.post("/v1/agents", json=body).status_code == 201
        task = {"task_id": "T-1", "description": "Fix the race in the Go worker", "priority": "critical"}
        assert http.post("/v1/tasks", json=task).status_code == 201
        assert http.post("/v1/tasks/T-1/classify", json={}).status_code == 200

        (run,) = http.post("/v1/queue/run").json()
        refused = http.post("/v1/tasks/T-1/assign")

    engine.close()
    assert run["status"] == "pending"
    assert run["agent_id"] is None
    assert "reclassify" in run["held_back"]
    assert refused.status_code == 409
    assert "reclassify" in refused.json()["error"]


async def test_a_queue_run_classifies_the_task_that_slides_into_its_window_when_one_is_held_back(
    engine: Engine,
) -> None:
    # Given two tasks without skills, never classified, and a model that cannot classify the first
    def reply(messages: list[dict[str, object]]) -> str:
        return MALFORMED if "Terraform" in json.dumps(messages) else GO_BUG

    engine.llm = llm = ScriptedLlm(reply)
    teams(engine)
    engine.create_task("T-1", "Write the Terraform module for the staging VPC")
    engine.create_task("T-2", "Fix the race in the Go worker")

    # When the queue runs one task at a time, classifying first
    offered = await engine.assign_pending_routed(limit=1)

    # Then the first, held back by its failed classification, leaves the window, and the one
    # that slides in is classified before it is assigned (not given to any agent unclassified)
    history = [entry.event_type for entry in engine.task_history("T-2")]
    assert history == ["Task.Created", "Task.Classified", "Task.Assigned"]
    placed = {t.task_id: t.assignment.agent_id if t.assignment else None for t in offered}
    assert placed["T-2"] == "backend"
    assert engine.get_task("T-1").held_back is not None
    assert len(llm.calls) == 3  # T-1 and its fallback, then T-2
