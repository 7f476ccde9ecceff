"""Two engines on one schema stand in for two servers: ranked assignments of one task through
each at once make one model call, not one each (each paid a tie-break call, the loser's kept only
as ``RankingDiscarded``). The task's ranking lock (``postgres/classification_locks.py``, purpose
``rank``) is held through the call and the assignment; the other engine waits for it, then finds
the task taken and asks nothing. In one engine this was already one call per task."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest

from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm
from tests.support.ranking import ranked_routing

pytestmark = pytest.mark.postgres

PICK = json.dumps({"agent_id": "ann", "reason": "knows the worker"})
WAIT_S = 10.0
"""The bound on every wait of these tests (none is reached when the engines behave)."""


@pytest.fixture
def two_servers(database_url: str, pg_schema: str, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """Two engines ranking by model on one schema, with agents ann and bob the rule cannot tell
    apart, and task t1 for them."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, routing_file=ranked_routing(tmp_path)
    )
    one, other = Engine(settings=settings), Engine(settings=settings)
    one.register_agent("ann", "Ann", ["golang"], 3)
    one.register_agent("bob", "Bob", ["golang"], 3)
    one.create_task("t1", "Fix the race in the Go worker", ["golang"])
    yield one, other
    one.close()
    other.close()


def event_names(engine: Engine, task_id: str) -> list[str]:
    return [entry.event_type.split(".")[-1] for entry in engine.task_history(task_id)]


def spy_on_rank_locks(engine: Engine, reached: threading.Event, hold: threading.Event | None = None) -> None:
    """Set ``reached`` when ``engine`` asks for a task's ranking lock (after waiting for ``hold``
    first, when given: its whole ranking is then decided after what the test did meanwhile)."""
    locks = engine.classifier.locks
    assert locks is not None
    take = locks.try_lock

    def try_lock(task: UUID, purpose: str = "classify") -> bool | None:
        if purpose == "rank":
            reached.set()
            if hold is not None:
                assert hold.wait(WAIT_S)
        return take(task, purpose)

    locks.try_lock = try_lock  # type: ignore[method-assign]


async def test_ranked_assignments_of_one_task_through_two_servers_at_once_make_one_call(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given one server's model call in flight (held open by the test)
    gate, first_called = asyncio.Event(), asyncio.Event()
    one.llm = first = ScriptedLlm(PICK, usage=USAGE, gate=gate, meanwhile=first_called.set)
    # And the other server about to rank the same task: it either asks for the task's ranking
    # lock or, without one, calls its own model (either sets ``second_moved``)
    second_moved = threading.Event()
    other.llm = second = ScriptedLlm(PICK, usage=USAGE, meanwhile=second_moved.set)
    spy_on_rank_locks(other, second_moved)
    assigning = asyncio.ensure_future(one.assign_task_ranked("t1"))
    await asyncio.wait_for(first_called.wait(), WAIT_S)

    # When the other server assigns it too while the first call is open
    other_assigning = asyncio.ensure_future(other.assign_task_ranked("t1"))
    assert await asyncio.to_thread(second_moved.wait, WAIT_S)
    gate.set()
    states = await asyncio.wait_for(asyncio.gather(assigning, other_assigning), WAIT_S)

    # Then one model call was made in all, and both answer the one assignment it decided
    assert (len(first.calls), len(second.calls)) == (1, 0)
    assert [state.agent_id for state in states] == ["ann", "ann"]
    assert event_names(one, "t1") == ["Created", "Assigned"]


async def test_a_server_that_read_the_task_before_anothers_whole_ranking_asks_nothing(
    two_servers: tuple[Engine, Engine],
) -> None:
    one, other = two_servers
    # Given a server that read the task waiting, tied, and is held just before the ranking lock
    at_lock, go_on = threading.Event(), threading.Event()
    other.llm = second = ScriptedLlm(PICK, usage=USAGE, meanwhile=at_lock.set)  # (no lock: it calls)
    spy_on_rank_locks(other, at_lock, hold=go_on)
    other_assigning = asyncio.ensure_future(other.assign_task_ranked("t1"))
    assert await asyncio.to_thread(at_lock.wait, WAIT_S)

    # When another server ranks and assigns the task meanwhile, then lets it go on
    one.llm = first = ScriptedLlm(PICK, usage=USAGE)
    assert (await one.assign_task_ranked("t1")).agent_id == "ann"
    go_on.set()
    state = await asyncio.wait_for(other_assigning, WAIT_S)

    # Then it finds the lock free but the task taken: no call, the one assignment
    assert (len(first.calls), len(second.calls)) == (1, 0)
    assert state.agent_id == "ann"
    assert event_names(one, "t1") == ["Created", "Assigned"]
