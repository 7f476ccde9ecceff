"""A queue run with a limit counts the tasks it decides, not those left waiting for capacity,
as it already did not count held-back ones: with the Go agent full, a critical Go task first in
the queue and a medium Python task behind it, ``assign_pending(limit=1)`` (``POST
/v1/queue/run {"limit": 1}``) offered the Go task every time, left it waiting, and never
reached the Python task while the Python agent stood idle."""

from __future__ import annotations

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def go_team_full(engine: Engine) -> None:
    engine.register_agent("go", "Go", ["golang"], capacity=1)
    engine.register_agent("py", "Python", ["python"], capacity=1)
    engine.create_task("busy", "Keep the Go agent busy", ["golang"])
    engine.assign_task("busy")
    engine.create_task("crit", "Fix the Go worker", ["golang"], "critical")
    engine.create_task("med", "Fix the Python client", ["python"], "medium")
    engine.create_task("low", "Tidy the Python docs", ["python"], "low")


def test_a_limited_run_passes_over_a_task_left_waiting_to_the_next(engine: Engine) -> None:
    # Given the critical task's agents all full, and an idle agent for the tasks behind it
    go_team_full(engine)

    # When the queue runs one task at a time
    offered = engine.assign_pending(limit=1)

    # Then the waiting task takes no place of the limit: the next one is placed
    assert [(s.task_id, s.status) for s in offered] == [
        ("crit", TaskStatus.PENDING),
        ("med", TaskStatus.ASSIGNED),
    ]
    assert offered[0].waiting is not None
    # And the limit still holds for the tasks decided: the low one waits for the next run
    assert engine.get_task("low").status is TaskStatus.PENDING


def test_over_rest_too() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    go_team_full(engine)
    with TestClient(create_app(engine)) as http:
        run = http.post("/v1/queue/run", json={"limit": 1}).json()
    engine.close()
    assert [(s["task_id"], s["status"]) for s in run] == [("crit", "pending"), ("med", "assigned")]


def test_a_run_whose_tasks_all_wait_answers_them_all_and_places_none(engine: Engine) -> None:
    engine.register_agent("go", "Go", ["golang"], capacity=1)
    engine.create_task("busy", "Keep it busy", ["golang"])
    engine.assign_task("busy")
    for task_id in ("a", "b", "c"):
        engine.create_task(task_id, task_id, ["golang"])
    offered = engine.assign_pending(limit=1)
    assert [(s.task_id, s.status) for s in offered] == [(t, TaskStatus.PENDING) for t in ("a", "b", "c")]
