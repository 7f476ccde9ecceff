"""The queue run has one default in the library and over REST: a task whose capable agents are
all full keeps waiting, so the next run offers it again when one frees up."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.task_queue import RunQueue
from flowledger.domain.task_views import EscalationReason, TaskState, TaskStatus
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.tasks import TaskService
from tests.conftest import make_settings


def one_slot_and_two_tasks(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=1)
    engine.create_task("t0", "Fix the API", ["python"])
    engine.create_task("t1", "Fix the CLI", ["python"])


def test_the_library_queue_run_leaves_tasks_that_wait_for_capacity_pending(engine: Engine) -> None:
    # Given one slot and two tasks that need it
    one_slot_and_two_tasks(engine)

    # When the queue runs with its defaults, then again once the slot frees up
    first = engine.assign_pending()
    engine.complete_task("t0", {"ok": True})
    second = engine.assign_pending()

    # Then the second task waited, and the next run gave it the slot
    assert [(s.task_id, s.status) for s in first] == [("t0", TaskStatus.ASSIGNED), ("t1", TaskStatus.PENDING)]
    assert [(s.task_id, s.agent_id) for s in second] == [("t1", "be")]


def test_a_queue_run_asked_to_escalates_tasks_whose_agents_are_all_full(engine: Engine) -> None:
    one_slot_and_two_tasks(engine)
    served = engine.assign_pending(escalate_when_full=True)
    assert served[1].escalation is not None
    assert served[1].escalation.reason == EscalationReason.ALL_AT_CAPACITY.value


def test_the_library_and_rest_run_the_queue_with_the_same_default() -> None:
    rest = RunQueue().escalate_when_full
    for method in (Engine.assign_pending, TaskService.assign_pending):
        assert inspect.signature(method).parameters["escalate_when_full"].default is rest is False
    # assign_task keeps its own default: a task asked for by name is escalated when all are full
    assert inspect.signature(Engine.assign_task).parameters["escalate_when_full"].default is True


def test_over_rest_the_run_leaves_them_pending_too() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    one_slot_and_two_tasks(engine)
    with TestClient(create_app(engine)) as http:
        run = http.post("/v1/queue/run").json()
    engine.close()
    assert [(s["task_id"], s["status"]) for s in run] == [("t0", "assigned"), ("t1", "pending")]


def test_a_queue_run_leaves_out_a_task_another_command_took_after_it_read_the_queue(engine: Engine) -> None:
    # (Two REST runs and a CLI run at once over 141 waiting tasks and 21 free slots each said
    # "21 assigned": a task another run had taken was answered as this run's.)
    engine.register_agent("be", "Backend", ["python"], capacity=5)
    for task_id in ("t1", "t2"):
        engine.create_task(task_id, task_id.upper(), ["python"])
    assigner = engine.tasks.assigner
    decide = assigner.assign_all

    def another_run_first(task_ids: list[str], *args: Any, **named: Any) -> list[TaskState]:
        engine.assign_task("t1")  # another run (another server) takes it after this one read the queue
        return decide(task_ids, *args, **named)

    assigner.assign_all = another_run_first  # type: ignore[method-assign]
    offered = engine.assign_pending()
    assert [(t.task_id, t.status) for t in offered] == [("t2", TaskStatus.ASSIGNED)]
    assert engine.get_agent("be").load == 2
    # Asked for by name, a task no longer waiting is still answered as it stands
    assert engine.assign_task("t1").status is TaskStatus.ASSIGNED
