"""A client's retry of an ending whose answer it lost is answered, not refused.

A Dify HTTP Request node (or any client) that retries ``complete`` after the first reply was
lost found the session already closed: 409 SessionClosed for a command that had succeeded.
The same ending again (the same resolution, the same abandon reason, a task's same result)
now answers with the state and records nothing; a different one is still refused.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import SessionClosed, TaskTransitionRejected
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def test_completing_a_session_again_with_the_same_resolution_records_nothing(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    first = engine.complete_session("s1", {"outcome": "refund", "amount": 12.5})
    version = engine.get_session("s1").version
    # When the client retries the completion it sent
    again = engine.complete_session("s1", {"amount": 12.5, "outcome": "refund"})
    # Then it is answered with the state, and no second Completed is stored
    assert again == first
    assert engine.get_session("s1").version == version
    assert [e.event_type for e in engine.history("s1")].count("Session.Completed") == 1
    # And the same text resolution too
    engine.start_session("s2", "cs")
    engine.complete_session("s2", "refund issued")
    assert engine.complete_session("s2", "refund issued").resolution == {"resolution": "refund issued"}


def test_another_resolution_or_another_ending_is_still_refused(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.complete_session("s1", {"outcome": "refund"})
    with pytest.raises(SessionClosed):
        engine.complete_session("s1", {"outcome": "replacement"})
    with pytest.raises(SessionClosed):
        engine.abandon_session("s1", "user left")
    engine.start_session("s2", "cs")
    engine.abandon_session("s2", "user left")
    with pytest.raises(SessionClosed):
        engine.complete_session("s2", {})
    with pytest.raises(SessionClosed):
        engine.abandon_session("s2", "another reason")


def test_abandoning_a_session_again_for_the_same_reason_records_nothing(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    first = engine.abandon_session("s1", "user left")
    version = engine.get_session("s1").version
    assert engine.abandon_session("s1", "user left") == first
    assert engine.get_session("s1").version == version


def test_an_erased_session_is_closed_to_a_repeated_ending() -> None:
    engine = Engine(settings=make_settings(database_url="memory:", seal_personal_data=True))
    engine.start_session("s1", "cs", user_id="u1")
    engine.complete_session("s1", {"outcome": "refund"})
    engine.forget_session("s1")
    with pytest.raises(SessionClosed, match="erased"):
        engine.complete_session("s1", {"outcome": "refund"})


def test_completing_a_task_again_with_the_same_result_records_nothing(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", skills=["python"], capacity=2)
    engine.create_task("t1", "Fix the login bug", required_skills=["python"])
    engine.assign_task("t1")
    first = engine.complete_task("t1", {"pr": 42})
    version = engine.get_task("t1").version
    again = engine.complete_task("t1", {"pr": 42})
    assert again == first
    assert engine.get_task("t1").version == version
    assert engine.get_agent("a1").load == 0  # the agent was freed once
    with pytest.raises(TaskTransitionRejected):
        engine.complete_task("t1", {"pr": 43})


def test_a_retried_completion_over_rest_answers_200_with_the_same_body(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s1", "workflow": "cs"}).status_code == 201
    first = memory_http.post("/v1/sessions/s1/complete", json={"resolution": {"ok": True}})
    again = memory_http.post("/v1/sessions/s1/complete", json={"resolution": {"ok": True}})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    other = memory_http.post("/v1/sessions/s1/complete", json={"resolution": {"ok": False}})
    assert other.status_code == 409


def test_starting_a_task_again_records_nothing(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", skills=["python"], capacity=2)
    engine.create_task("t1", "Fix the login bug", required_skills=["python"])
    engine.assign_task("t1")
    first = engine.start_task("t1")
    assert engine.start_task("t1") == first
    assert engine.get_task("t1").version == first.version
    engine.complete_task("t1")
    with pytest.raises(TaskTransitionRejected):
        engine.start_task("t1")


def test_releasing_a_task_again_for_the_same_reason_records_nothing(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", skills=["python"], capacity=2)
    engine.create_task("t1", "Fix the login bug", required_skills=["python"])
    engine.assign_task("t1")
    first = engine.release_task("t1", "out sick")
    assert engine.release_task("t1", "out sick") == first
    assert engine.get_task("t1").version == first.version
    assert engine.get_agent("a1").load == 0
    # Another reason, or a release once the task was assigned again and let go otherwise, is refused
    with pytest.raises(TaskTransitionRejected):
        engine.release_task("t1", "another reason")


def test_requeuing_a_task_again_by_the_same_person_for_the_same_reason_records_nothing(
    engine: Engine,
) -> None:
    # Given a task escalated because nobody could take it, then requeued by a person
    engine.create_task("t1", "Write the Helm chart", required_skills=["helm"])
    assert engine.assign_task("t1").status is TaskStatus.ESCALATED
    first = engine.requeue_task("t1", "alice@example.com", "Platform joined", timedelta(hours=8))

    # When the client retries the requeue whose answer it lost (it was a 409, "it is pending")
    again = engine.requeue_task("t1", "alice@example.com", "Platform joined", timedelta(hours=8))

    # Then it is answered with the state, and no second Requeued is stored
    assert again == first
    assert [e.event_type for e in engine.task_history("t1")].count("Task.Requeued") == 1
    # And so is a retry once a queue run has placed the task since
    engine.register_agent("platform", "Platform", skills=["helm"], capacity=2)
    (placed,) = engine.assign_pending()
    assert engine.requeue_task("t1", "alice@example.com", "Platform joined", timedelta(hours=8)) == placed
    assert engine.get_task("t1").version == placed.version


def test_another_requeue_of_a_task_no_longer_escalated_is_still_refused(engine: Engine) -> None:
    engine.create_task("t1", "Write the Helm chart", required_skills=["helm"])
    deadline = datetime.now(UTC) + timedelta(hours=8)
    with pytest.raises(TaskTransitionRejected):  # never escalated, never requeued
        engine.requeue_task("t1", "alice", "Platform joined")
    engine.assign_task("t1")
    engine.requeue_task("t1", "alice", "Platform joined", deadline)
    # Another person, another reason, another deadline, or one where none was given
    for who, why, when in (
        ("bob", "Platform joined", deadline),
        ("alice", "another reason", deadline),
        ("alice", "Platform joined", deadline + timedelta(hours=1)),
        ("alice", "Platform joined", None),
    ):
        with pytest.raises(TaskTransitionRejected, match="it is pending"):
            engine.requeue_task("t1", who, why, when)
    assert [e.event_type for e in engine.task_history("t1")].count("Task.Requeued") == 1


def test_a_retried_requeue_over_rest_answers_200_with_the_same_body(memory_http: TestClient) -> None:
    task = {"task_id": "t1", "description": "Write the Helm chart", "required_skills": ["helm"]}
    assert memory_http.post("/v1/tasks", json=task).status_code == 201
    assert memory_http.post("/v1/tasks/t1/assign").json()["status"] == "escalated"
    asked = {"requested_by": "alice", "reason": "Platform joined", "deadline_hours": 8}
    first = memory_http.post("/v1/tasks/t1/requeue", json=asked)
    again = memory_http.post("/v1/tasks/t1/requeue", json=asked)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    other = memory_http.post("/v1/tasks/t1/requeue", json={**asked, "reason": "another"})
    assert other.status_code == 409
