"""A start, complete, release or requeue refused by the task's status names the task, where it
stands (its assignment and holder, or that no agent holds it) and, when the command named one,
the assignment it was sent for: "cannot complete task 'T1': it is pending" left a caller who
sent it for assignment 1 to guess whether that was released, requeued or never made. Over
REST the 409's message is the same. On both backends."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import TaskTransitionRejected
from flowledger.infrastructure import Engine


def refusal(engine: Engine, command: str, *args: object, **named: object) -> str:
    """The message of the TaskTransitionRejected that ``command`` raises; nothing recorded."""
    version = engine.get_task("T1").version
    with pytest.raises(TaskTransitionRejected) as refused:
        getattr(engine, command)("T1", *args, **named)
    assert engine.get_task("T1").version == version
    return str(refused.value)


def test_a_task_never_assigned(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    where = "it is pending, never assigned (no agent holds it)"
    assert refusal(engine, "complete_task") == f"cannot complete task 'T1': {where}"
    assert refusal(engine, "complete_task", assignment=1) == (
        f"cannot complete task 'T1' (sent for assignment 1): {where}; nothing done"
    )
    assert refusal(engine, "release_task", agent_id="a1", assignment=1) == (
        f"cannot release task 'T1' (sent for assignment 1 of agent 'a1'): {where}; nothing done"
    )
    assert refusal(engine, "start_task", agent_id="a1") == (
        f"cannot start task 'T1' (sent for agent 'a1'): {where}; nothing done"
    )
    assert refusal(engine, "requeue_task", "bob", "why") == f"cannot requeue task 'T1': {where}"


def test_a_task_released_back_to_the_queue(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    engine.assign_task("T1")
    engine.release_task("T1", "agent restarting")
    assert refusal(engine, "complete_task", assignment=1) == (
        "cannot complete task 'T1' (sent for assignment 1): it is pending, back in the queue after"
        " assignment 1 (no agent holds it); nothing done"
    )


def test_a_task_held_or_completed(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    engine.assign_task("T1")
    assert refusal(engine, "requeue_task", "bob", "why") == (
        "cannot requeue task 'T1': it is assigned, on assignment 1, held by agent 'a1'"
    )
    engine.complete_task("T1", {"pr": 1})
    assert refusal(engine, "release_task", assignment=1) == (
        "cannot release task 'T1' (sent for assignment 1): it is completed by agent 'a1' on"
        " assignment 1; nothing done"
    )
    assert refusal(engine, "start_task") == (
        "cannot start task 'T1': it is completed by agent 'a1' on assignment 1"
    )


def test_an_escalated_task(engine: Engine) -> None:
    engine.create_task("T1", "Fix the cobol batch", ["cobol"])
    engine.assign_task("T1")  # nobody covers cobol: escalated
    assert refusal(engine, "complete_task", agent_id="a1") == (
        "cannot complete task 'T1' (sent for agent 'a1'): it is escalated (no agent holds it); nothing done"
    )


def test_rest_answers_the_same_message_in_its_409(engine: Engine) -> None:
    engine.register_agent("a1", "Ann", ["python"], capacity=2)
    engine.create_task("T1", "Fix the python parser", ["python"])
    with TestClient(create_app(engine)) as client:
        for path, body, message in [
            (
                "complete",
                {"assignment": 1, "agent_id": "a1"},
                "cannot complete task 'T1' (sent for assignment 1 of agent 'a1'): it is pending,"
                " never assigned (no agent holds it); nothing done",
            ),
            ("release", {}, "cannot release task 'T1': it is pending, never assigned (no agent holds it)"),
            (
                "start",
                {"assignment": 2},
                "cannot start task 'T1' (sent for assignment 2): it is pending,"
                " never assigned (no agent holds it); nothing done",
            ),
        ]:
            answer = client.post(f"/v1/tasks/T1/{path}", json=body)
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"] == message, path
