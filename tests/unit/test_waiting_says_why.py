"""A queue run that leaves a task waiting for capacity says why, per task, in the library and
over REST: the answer's ``waiting`` names the capable agents and their load (or their pause),
where it said nothing (``held_back`` null, no other field), so a caller could not tell a task
waiting for a full team from one that was never looked at."""

from __future__ import annotations

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def one_slot_and_two_tasks(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=1)
    engine.create_task("t0", "Fix the API", ["python"])
    engine.create_task("t1", "Fix the CLI", ["python"])


def test_a_task_left_waiting_by_a_queue_run_says_its_capable_agents_are_full(engine: Engine) -> None:
    # Given one slot and two tasks that need it
    one_slot_and_two_tasks(engine)

    # When the queue runs
    first, second = engine.assign_pending()

    # Then the task placed waits for nothing, and the one left waiting says why
    assert (first.status, first.waiting) == (TaskStatus.ASSIGNED, None)
    assert second.status is TaskStatus.PENDING
    assert second.held_back is None  # it was offered: nothing holds it back
    assert second.waiting == "the 1 capable agent is at capacity: be 1/1"


def test_a_task_whose_only_capable_agent_is_paused_says_so(engine: Engine) -> None:
    engine.register_agent("pz", "Paused", ["golang"], capacity=1)
    engine.set_agent_capacity("pz", 0)
    engine.create_task("t-go", "Fix the Go worker", ["golang"])

    [state] = engine.assign_pending()

    assert state.status is TaskStatus.PENDING
    assert state.waiting == "the 1 capable agent is at capacity: pz paused (capacity 0)"


def test_the_reason_is_the_answer_s_alone_a_read_of_the_task_names_none(engine: Engine) -> None:
    one_slot_and_two_tasks(engine)
    engine.assign_pending()
    # A read cannot know the roster now: only a run's (or an assignment's) answer says it
    assert engine.get_task("t1").waiting is None


def test_over_rest_the_run_says_why_each_waiting_task_waits() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    one_slot_and_two_tasks(engine)
    with TestClient(create_app(engine)) as http:
        run = http.post("/v1/queue/run").json()
        read = http.get("/v1/tasks/t1").json()
    engine.close()
    assert [(s["task_id"], s["status"], s["waiting"]) for s in run] == [
        ("t0", "assigned", None),
        ("t1", "pending", "the 1 capable agent is at capacity: be 1/1"),
    ]
    assert read["waiting"] is None
