"""Ranked assignments of one task at once in one process make one model call: the later ones
wait for the first to decide, then find the task taken and ask nothing. Each made its own
call before (a client's double submit paid the model twice, the second call kept only as
``RankingDiscarded``), as classifications of one task did before their single flight."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import USAGE, ScriptedLlm
from tests.support.ranking import two_golang_agents

PICK = json.dumps({"agent_id": "ann", "reason": "knows the worker"})


@pytest.fixture(params=["memory", "postgres"])
def ranked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine with ``model_ranked_matching`` on and two agents the rule cannot tell apart."""
    yield from two_golang_agents(request, tmp_path, capacity=3)


async def test_two_ranked_assignments_of_one_task_at_once_make_one_call(ranked: Engine) -> None:
    # Given a tie, and a call that lets the event loop run the other caller meanwhile
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    ranked.llm = llm = ScriptedLlm(PICK, usage=USAGE, yields=5)

    # When the same assignment is asked twice at once (a double submit)
    first, second = await asyncio.gather(ranked.assign_task_ranked("t1"), ranked.assign_task_ranked("t1"))

    # Then one call is made and recorded, and both are answered with the one assignment
    assert len(llm.calls) == 1
    assert first == second
    assert first.agent_id == "ann"
    assert [entry.event_type for entry in ranked.task_history("t1")] == ["Task.Created", "Task.Assigned"]


async def test_ranked_assignments_of_different_tasks_do_not_wait_for_each_other(ranked: Engine) -> None:
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    ranked.create_task("t2", "Fix the Go client", ["golang"])
    gate, both_asked = asyncio.Event(), asyncio.Event()

    def asked() -> None:
        if len(llm.calls) == 2:
            both_asked.set()

    ranked.llm = llm = ScriptedLlm(PICK, usage=USAGE, gate=gate, meanwhile=asked)

    # Both calls are in flight at once (neither waits for the other's assignment); the bound
    # only keeps a failure from hanging the run
    both = asyncio.gather(ranked.assign_task_ranked("t1"), ranked.assign_task_ranked("t2"))
    await asyncio.wait_for(both_asked.wait(), timeout=60)
    gate.set()
    assert [state.status.value for state in await both] == ["assigned", "assigned"]


async def test_a_task_id_that_is_no_string_is_still_refused(ranked: Engine) -> None:
    ranked.llm = ScriptedLlm(PICK, usage=USAGE)
    with pytest.raises(ValidationError):
        await ranked.assign_task_ranked(["t1"])  # type: ignore[arg-type]
