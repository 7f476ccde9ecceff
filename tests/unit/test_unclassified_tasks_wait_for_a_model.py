"""Classification drives routing wherever the queue is run as the seed's pipeline (REST's
``POST /v1/queue/run``, the CLI's ``tasks run-queue``, ``assign_pending_routed``): a task that
names no skills and was never classified waits when no model is there to classify it, and
the run's answer says so, rather than give it to any agent with room ("covers no particular
skills"), as the CLI did without ``FLOWLEDGER_LLM_BASE_URL`` while REST (whose server always
has a model) classified it first. The library's synchronous commands still route it so, as
docs/tasks.md says, and the reason now says why. On both backends."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import TaskNeedsClassification
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.assigner import NEVER_CLASSIFIED
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL


def teams_and_a_go_bug(engine: Engine) -> None:
    """Backend and DevOps, a Go bug created without skills, and a task naming its skills."""
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"], capacity=3)
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"], capacity=3)
    engine.create_task("T-1", "Fix the race in the Go worker", [], "critical")
    engine.create_task("T-2", "Tune the probes", ["kubernetes"], "low")


def kinds(engine: Engine, task_id: str) -> list[str]:
    return [entry.event_type for entry in engine.task_history(task_id)]


async def test_a_routed_queue_run_without_a_model_leaves_an_unclassified_task_waiting_saying_why(
    engine: Engine,
) -> None:
    # Given no model, a Go bug without skills, and a task naming its skills
    assert engine.llm is None
    teams_and_a_go_bug(engine)

    # When the queue runs as REST and the CLI run it
    offered = await engine.assign_pending_routed()

    # Then the task naming its skills is assigned, and the Go bug waits, named in the answer
    # with why (it went, "covers no particular skills", to whichever agent had room)
    assert [(t.task_id, t.status.value, t.agent_id) for t in offered] == [
        ("T-1", "pending", None),
        ("T-2", "assigned", "backend"),
    ]
    assert offered[0].held_back == UNCLASSIFIED_NO_MODEL
    assert kinds(engine, "T-1") == ["Task.Created"]

    # And a limited run still places a task: the waiting one takes no place of its limit
    engine.create_task("T-3", "Tune the probes again", ["kubernetes"], "low")
    again = await engine.assign_pending_routed(limit=1)
    assert [(t.task_id, t.status.value) for t in again] == [("T-1", "pending"), ("T-3", "assigned")]

    # And once it is classified (elsewhere), the next run sends it by its words
    engine.record_classification("T-1", "bug_fix", "medium", 3.0)
    placed = await engine.assign_pending_routed()
    assert [(t.task_id, t.agent_id) for t in placed] == [("T-1", "backend")]


async def test_a_routed_assignment_without_a_model_refuses_an_unclassified_task(engine: Engine) -> None:
    teams_and_a_go_bug(engine)
    with pytest.raises(TaskNeedsClassification, match="never classified, and no model is configured"):
        await engine.assign_task_ranked("T-1")
    assert kinds(engine, "T-1") == ["Task.Created"]
    # A task naming its skills is assigned as before
    assert (await engine.assign_task_ranked("T-2")).agent_id == "backend"


def test_rest_answers_the_run_and_the_assignment_as_the_library_decides(engine: Engine) -> None:
    # Given an engine without a model served over REST (as a library user may serve it)
    teams_and_a_go_bug(engine)
    with TestClient(create_app(engine)) as client:
        # When the queue runs, then the task is assigned or waits as above, saying why
        ran = client.post("/v1/queue/run")
        assert ran.status_code == 200, ran.text
        assert [(t["task_id"], t["status"], t["held_back"]) for t in ran.json()] == [
            ("T-1", "pending", UNCLASSIFIED_NO_MODEL),
            ("T-2", "assigned", None),
        ]
        # And assigning the Go bug by name is a 409 saying why, nothing recorded
        assigned = client.post("/v1/tasks/T-1/assign")
        assert assigned.status_code == 409, assigned.text
        assert assigned.json()["error"] == f"cannot assign task 'T-1': {UNCLASSIFIED_NO_MODEL}"
    assert kinds(engine, "T-1") == ["Task.Created"]


def test_the_synchronous_commands_still_route_it_and_the_reason_says_it_was_never_classified(
    engine: Engine,
) -> None:
    teams_and_a_go_bug(engine)
    placed = engine.assign_pending()
    go_bug = next(t for t in placed if t.task_id == "T-1")
    assert go_bug.status.value == "assigned"
    assert go_bug.assignment is not None
    assert go_bug.assignment.reason.startswith(f"{NEVER_CLASSIFIED}: covers no particular skills; ")
    # A task classified or naming its skills is explained as before
    task = next(t for t in placed if t.task_id == "T-2")
    assert task.assignment is not None
    assert task.assignment.reason.startswith("covers kubernetes; ")


def test_rest_says_why_a_task_waits_without_a_model_when_asked_for_it_not_only_in_the_run(
    engine: Engine,
) -> None:
    # Given an engine without a model served over REST, and a task created without skills
    teams_and_a_go_bug(engine)
    with TestClient(create_app(engine)) as client:
        # When it is created, read, or listed, then held_back says why it waits, as the queue
        # run's answer does (they said null: the run held it back, the task read as free to go)
        created = client.post("/v1/tasks", json={"task_id": "T-9", "description": "Fix the Go build"})
        read = client.get("/v1/tasks/T-1")
        listed = client.get("/v1/tasks", params={"status": "pending"})
        assert (created.status_code, read.status_code, listed.status_code) == (201, 200, 200)
        assert created.json()["held_back"] == UNCLASSIFIED_NO_MODEL
        assert read.json()["held_back"] == UNCLASSIFIED_NO_MODEL
        assert [(t["task_id"], t["held_back"]) for t in listed.json()] == [
            ("T-1", UNCLASSIFIED_NO_MODEL),
            ("T-2", None),
            ("T-9", UNCLASSIFIED_NO_MODEL),
        ]
        # And given to an agent by the library's synchronous rule and released, it is held back again
        assert engine.assign_task("T-9").status.value == "assigned"
        released = client.post("/v1/tasks/T-9/release")
        assert released.status_code == 200, released.text
        assert released.json()["held_back"] == UNCLASSIFIED_NO_MODEL
        # And once it is classified it is held back no more
        engine.record_classification("T-1", "bug_fix", "medium", 3.0)
        assert client.get("/v1/tasks/T-1").json()["held_back"] is None
    # The library's own view is the library's rule: its synchronous commands route such a task
    assert engine.get_task("T-9").held_back is None
