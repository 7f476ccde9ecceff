"""Two commands of one engine never share a cached aggregate (found by ``make soak``: an agent's
stream got a version gap, ``OriginatorVersionError (3545, 3544)`` on every later load, and
a load of 4 against a capacity of 3).

Completions of two tasks hold different in-process locks (the tasks' keys) but touch the same
agent. When both took the writers' cached Agent object itself, the second one decided on the
first one's release before it was committed, and wrote its own at the next version; the
first one's save then lost to another server, and the log kept the second release with no
event before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.conftest import make_settings
from tests.support.store_checks import version_gaps

WAIT_S = 10.0


@pytest.fixture
def two_servers(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    one, other = (Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) for _ in "ab")
    yield one, other
    one.close()
    other.close()


def test_a_completion_whose_save_is_lost_leaves_no_gap_in_its_agents_stream(
    two_servers: tuple[Engine, Engine], database_url: str, pg_schema: str
) -> None:
    one, other = two_servers
    # Given an agent holding two tasks, cached in this engine's writers' cache
    one.register_agent("a-1", "Agent 1", ["python"], capacity=3)
    for task_id in ("T-1", "T-2"):
        one.create_task(task_id, "fix the worker", ["python"])
        assert one.assign_task(task_id).status is TaskStatus.ASSIGNED
    first_decided, second_done = threading.Event(), threading.Event()
    save: Callable[..., None] = one.store._save

    def paused(uow: UnitOfWork, events: list[Any]) -> None:
        # The completion of T-1 has decided (released T-1 on its agent): hold its save until
        # the completion of T-2 is done, once.
        if threading.current_thread().name == "complete-T-1" and not first_decided.is_set():
            first_decided.set()
            assert second_done.wait(WAIT_S)
        save(uow, events)

    one.store._save = paused  # type: ignore[method-assign]
    outcome: list[BaseException | str] = []

    def complete_first() -> None:
        try:
            outcome.append(one.complete_task("T-1", {"fixed": True}).status.value)
        except BaseException as error:  # handed to the test's thread below
            outcome.append(error)

    worker = threading.Thread(target=complete_first, name="complete-T-1")
    worker.start()
    assert first_decided.wait(WAIT_S)
    # When another server moves T-1 on first (the held save will lose on its version),
    other.start_task("T-1")
    # and this engine completes T-2 meanwhile (another task's lock: it runs at once)
    try:
        assert one.complete_task("T-2", {"fixed": True}).status is TaskStatus.COMPLETED
    finally:
        second_done.set()
        worker.join(WAIT_S)
    # Then no stream has a version missing,
    assert version_gaps(database_url, pg_schema) == []
    # the completion of T-1 retried on the log's state and succeeded,
    assert outcome == [TaskStatus.COMPLETED.value]
    # and the agent, both releases stored, loads and is free
    agent = one.get_agent("a-1")
    assert agent.load == 0
    assert other.get_agent("a-1").load == 0
