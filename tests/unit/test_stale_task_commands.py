"""A retried or stale command on a task's assignment acts on the assignment it was sent for.

An outside probe: a client released a task (`POST /v1/tasks/T1/release`, reason "agent
restarting"), lost the reply, a queue run (`POST /v1/queue/run`) assigned the task again, and
the client's retry of the same release released the NEW assignment (history: Assigned a1,
Released a1, Assigned a1, Released a1). A release, start or complete may now name the
assignment it means (``agent_id``, ``assignment``: the task's ``times_assigned`` when it was
given it): another one is refused (TaskAssignmentChanged, HTTP 409), nothing recorded. A
release or requeue with an idempotency key is one request: sent again, it is answered with the
task as the first send left it, recording nothing, whatever happened since. Callers naming
neither are answered as before.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import (
    TaskAssignmentChanged,
    TaskIdempotencyKeyReused,
    TaskTransitionRejected,
    ValidationError,
)
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def events(engine: Engine, task_id: str) -> list[str]:
    return [entry.event_type for entry in engine.task_history(task_id)]


def released_and_assigned_again(engine: Engine, *, key: str | None = None) -> None:
    """T1 assigned to a1, released (under ``key``), then assigned to a1 again by a queue run."""
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    engine.assign_task("T1")
    engine.release_task("T1", "agent restarting", idempotency_key=key)
    (again,) = engine.assign_pending()
    assert again.status is TaskStatus.ASSIGNED
    assert again.times_assigned == 2


def test_a_release_retried_under_its_key_after_a_queue_run_is_answered_with_its_first_result(
    engine: Engine,
) -> None:
    # Given a release sent under a key, whose reply was lost, and a queue run since
    released_and_assigned_again(engine, key="rel-1")
    before = engine.get_task("T1")

    # When the client sends the same release again
    answer = engine.release_task("T1", "agent restarting", idempotency_key="rel-1")

    # Then it is answered with what the first send did, and the new assignment stands
    assert answer.status is TaskStatus.PENDING
    assert answer.version == 3
    assert engine.get_task("T1") == before
    assert events(engine, "T1").count("Task.Released") == 1
    assert engine.get_agent("a1").load == 1


def test_an_idempotency_key_reused_for_another_release_or_a_requeue_is_refused(engine: Engine) -> None:
    released_and_assigned_again(engine, key="rel-1")
    version = engine.get_task("T1").version
    with pytest.raises(TaskIdempotencyKeyReused, match=r"'rel-1'.*release for 'agent restarting'"):
        engine.release_task("T1", "another reason", idempotency_key="rel-1")
    with pytest.raises(ValidationError, match="idempotency_key"):
        engine.release_task("T1", "agent restarting", idempotency_key=" ")
    assert engine.get_task("T1").version == version


def test_a_keyed_release_is_not_taken_for_the_retry_of_another_callers_release(engine: Engine) -> None:
    # (A probe of two servers: a keyed release, sent after another caller's unkeyed release for
    # the same reason, was answered 200 as that one's retry, recording nothing under its key;
    # its own retry after a queue run was then a 409. Under a key, the log alone answers.)
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    engine.assign_task("T1")
    engine.release_task("T1", "agent restarting")
    with pytest.raises(TaskTransitionRejected, match="it is pending"):
        engine.release_task("T1", "agent restarting", idempotency_key="rel-2")
    engine.assign_pending()
    with pytest.raises(TaskAssignmentChanged):
        engine.release_task("T1", "agent restarting", assignment=1, idempotency_key="rel-2")
    assert events(engine, "T1").count("Task.Released") == 1


def test_a_release_naming_an_earlier_assignment_is_refused_and_records_nothing(engine: Engine) -> None:
    # Given a task released from its first assignment and assigned again (to the same agent)
    released_and_assigned_again(engine)
    version = engine.get_task("T1").version

    # When a stale release names the first assignment, or another agent
    with pytest.raises(TaskAssignmentChanged, match="assignment 2, held by agent 'a1', not assignment 1"):
        engine.release_task("T1", "agent restarting", assignment=1)
    with pytest.raises(TaskAssignmentChanged, match="held by agent 'a1', not 'b1'"):
        engine.release_task("T1", "agent restarting", agent_id="b1")

    # Then nothing was recorded; naming the current one releases it
    assert engine.get_task("T1").version == version
    released = engine.release_task("T1", "done for today", agent_id="a1", assignment=2)
    assert released.status is TaskStatus.PENDING
    assert engine.get_agent("a1").load == 0


def test_a_start_or_complete_from_an_agent_that_lost_the_task_is_refused(engine: Engine) -> None:
    # Given T1 released by a1 and given to b1
    engine.register_agent("a1", "Ann", ["python"], capacity=1)
    engine.register_agent("b1", "Bob", ["python"], capacity=1)
    engine.create_task("T1", "Fix the python parser", ["python"])
    first = engine.assign_task("T1").agent_id
    other = "b1" if first == "a1" else "a1"
    engine.release_task("T1", "going home")
    engine.set_agent_capacity(first, 0)
    assert engine.assign_task("T1").agent_id == other
    version = engine.get_task("T1").version

    # When the first agent starts or completes it
    with pytest.raises(TaskAssignmentChanged):
        engine.start_task("T1", agent_id=first)
    with pytest.raises(TaskAssignmentChanged):
        engine.complete_task("T1", {"pr": 1}, agent_id=first, assignment=1)

    # Then nothing was recorded; the holder's own commands go through, and a retry is answered
    assert engine.get_task("T1").version == version
    assert engine.start_task("T1", agent_id=other, assignment=2).status is TaskStatus.IN_PROGRESS
    done = engine.complete_task("T1", {"pr": 2}, agent_id=other, assignment=2)
    assert engine.complete_task("T1", {"pr": 2}, agent_id=other, assignment=2) == done
    with pytest.raises(TaskTransitionRejected):
        engine.complete_task("T1", {"pr": 2}, agent_id=first)


def test_a_requeue_retried_under_its_key_after_the_task_was_escalated_again_is_answered(
    engine: Engine,
) -> None:
    # Given a task escalated, requeued under a key, and escalated again (nobody covers helm)
    engine.create_task("T1", "Write the Helm chart", ["helm"])
    engine.assign_task("T1")
    asked = ("T1", "alice", "Platform joins soon", timedelta(hours=8))
    first = engine.requeue_task(*asked, idempotency_key="rq-1")
    assert engine.assign_task("T1").status is TaskStatus.ESCALATED
    version = engine.get_task("T1").version

    # When the lost requeue is sent again
    answer = engine.requeue_task(*asked, idempotency_key="rq-1")

    # Then it is answered with its first result, and the second escalation waits for a person
    assert answer == first
    assert engine.get_task("T1").version == version
    assert engine.get_task("T1").status is TaskStatus.ESCALATED
    assert events(engine, "T1").count("Task.Requeued") == 1
    with pytest.raises(TaskIdempotencyKeyReused):
        engine.release_task("T1", "released", idempotency_key="rq-1")


async def test_a_release_key_reused_for_a_classification_is_refused_with_no_call(engine: Engine) -> None:
    released_and_assigned_again(engine, key="rel-1")
    version = engine.get_task("T1").version
    engine.llm = ScriptedLlm('{"category": "bug_fix", "complexity": "low", "estimated_hours": 1}')
    with pytest.raises(TaskIdempotencyKeyReused, match=r"'rel-1'.*a release"):
        await engine.reclassify_task("T1", idempotency_key="rel-1")
    assert engine.llm.calls == []
    assert engine.get_task("T1").version == version


def test_rest_takes_the_assignment_and_the_key_and_answers_a_stale_release_409(
    memory_http: TestClient,
) -> None:
    http = memory_http
    http.post("/v1/agents", json={"agent_id": "a1", "name": "A1", "skills": ["python"], "capacity": 2})
    http.post("/v1/tasks", json={"task_id": "T1", "description": "Fix it", "required_skills": ["python"]})
    assigned = http.post("/v1/tasks/T1/assign").json()
    body = {"reason": "agent restarting", "agent_id": "a1", "assignment": assigned["times_assigned"]}
    first = http.post("/v1/tasks/T1/release", json=body, headers={"Idempotency-Key": "r-1"})
    assert first.status_code == 200, first.text
    http.post("/v1/queue/run")

    # The retry under the key: its first answer; the stale release without it: a 409 saying why
    retried = http.post("/v1/tasks/T1/release", json={**body, "idempotency_key": "r-1"})
    assert retried.status_code == 200
    assert retried.json() == first.json()
    stale = http.post("/v1/tasks/T1/release", json=body)
    assert stale.status_code == 409, stale.text
    assert "not assignment 1" in stale.text
    assert http.get("/v1/tasks/T1").json()["status"] == "assigned"
    bad = http.post("/v1/tasks/T1/start", json={"assignment": 0})
    assert bad.status_code == 422
