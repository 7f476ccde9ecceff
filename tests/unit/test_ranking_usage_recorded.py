"""A model-ranking call is recorded with its usage whatever the assignment then does: on
``Assigned`` or ``Escalated`` when the task is placed or escalated, else as
``Task.RankingDiscarded`` (the task waited for capacity, another command took it during the
call, or it was refused), so that the cost views count every call the budgets charged.
It went unrecorded: a task whose agents filled up during the call waited with no event, and
the cost dashboard showed $0 for a call the model was paid for."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from flowledger.domain.errors import TaskNeedsClassification
from flowledger.domain.task import task_uuid
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.ranking import Ranking
from flowledger.projections import TaskStep, dashboard, projector_for
from flowledger.projections.calls import call_of
from tests.conftest import make_settings
from tests.support.clock import SetClock
from tests.support.llm import USAGE, ScriptedLlm
from tests.support.ranking import ranked_routing, two_golang_agents

PICK = json.dumps({"agent_id": "ann", "reason": "knows the worker"})


@pytest.fixture(params=["memory", "postgres"])
def ranked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine with ``model_ranked_matching`` on and two agents the rule cannot tell apart,
    each with room for one task."""
    yield from two_golang_agents(request, tmp_path, capacity=1)


def recorded_calls(engine: Engine, task_id: str) -> list[tuple[str, object]]:
    """The model calls the task's events record, as the cost views read them."""
    events = engine.log.stream(task_uuid(engine.tenant, task_id))
    return [(call.step, call.usage) for call in map(call_of, events) if call is not None]


def fill_both(engine: Engine) -> None:
    for task_id in ("x1", "x2"):
        engine.create_task(task_id, "Other Go work", ["golang"])
        engine.assign_task(task_id)


async def test_a_task_left_waiting_after_the_call_keeps_its_usage(ranked: Engine) -> None:
    # Given a tie, and both agents filled by other assignments while the model thinks
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    ranked.llm = llm = ScriptedLlm(PICK, usage=USAGE, meanwhile=lambda: fill_both(ranked))

    # When the task is assigned without escalating a full team
    state = await ranked.assign_task_ranked("t1", escalate_when_full=False)

    # Then it waits, and the paid call is recorded on it as a skill-matching call
    assert len(llm.calls) == 1
    assert state.status is TaskStatus.PENDING
    assert state.waiting is not None
    last = ranked.task_history("t1")[-1]
    assert last.event_type == "Task.RankingDiscarded"
    assert last.data["usage"] == USAGE
    assert last.data["reason"].startswith("not assigned: the task waits for capacity (all 2 capable")
    assert last.data["reason"].endswith("; the model picked ann (deepseek-v3.2: knows the worker)")
    assert recorded_calls(ranked, "t1") == [("skill_matching", USAGE)]
    assert ranked.get_task("t1").version == state.version  # the answer is the task as recorded


async def test_a_task_taken_by_another_command_during_the_call_keeps_its_usage(ranked: Engine) -> None:
    # Given a tie, and the task assigned by another command while the model thinks
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    ranked.llm = ScriptedLlm(PICK, usage=USAGE, meanwhile=lambda: ranked.assign_task("t1"))

    # When the ranked assignment comes to it
    state = await ranked.assign_task_ranked("t1", escalate_when_full=False)

    # Then it is answered as the other command left it, and the call is still recorded
    assert state.status is TaskStatus.ASSIGNED
    types = [entry.event_type for entry in ranked.task_history("t1")]
    assert types == ["Task.Created", "Task.Assigned", "Task.RankingDiscarded"]
    assert ranked.task_history("t1")[1].data["usage"] is None  # the other command called no model
    assert recorded_calls(ranked, "t1") == [("skill_matching", USAGE)]
    assert ranked.get_task("t1") == state


async def test_a_refused_assignment_keeps_its_rankings_usage(ranked: Engine) -> None:
    # Given a task held back (it names no skills and its classification failed), and a ranking
    # made for it (a classification that failed elsewhere during the call)
    ranked.llm = ScriptedLlm("this is not a classification", usage=USAGE)
    ranked.create_task("h", "Fix the race in the Go worker")
    assert (await ranked.classify_task("h")).held_back is not None
    before = recorded_calls(ranked, "h")
    ranking = Ranking(agent_id="ann", usage=USAGE, note="m: knows the worker")

    # When the assignment is asked for by name, it is refused
    with pytest.raises(TaskNeedsClassification):
        ranked.tasks.assign_task("h", escalate_when_full=False, ranking=ranking)

    # Then the call is recorded all the same, once
    assert recorded_calls(ranked, "h") == [*before, ("skill_matching", USAGE)]
    assert ranked.task_history("h")[-1].event_type == "Task.RankingDiscarded"


async def test_a_ranking_call_cancelled_after_it_was_billed_keeps_its_usage(ranked: Engine) -> None:
    # Given a tie, and a caller cancelled during the call, after its adapter said what it used
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    cancelled = asyncio.CancelledError()
    cancelled.usage = USAGE  # type: ignore[attr-defined]  # the LlmPort's way to say it
    ranked.llm = ScriptedLlm(PICK, error=cancelled)

    # When the ranked assignment is cancelled with it
    with pytest.raises(asyncio.CancelledError):
        await ranked.assign_task_ranked("t1")

    # Then the task waits as it was, and the call it paid for is recorded
    assert ranked.get_task("t1").status is TaskStatus.PENDING
    last = ranked.task_history("t1")[-1]
    assert last.event_type == "Task.RankingDiscarded"
    assert last.data["reason"].startswith("not assigned: cancelled during the call; model ranking on")
    assert recorded_calls(ranked, "t1") == [("skill_matching", USAGE)]


@pytest.mark.parametrize("backend", ["memory", "postgres"])
async def test_no_ranking_call_is_paid_for_a_task_past_its_deadline(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    # Given a tie, and a task whose deadline passed before it was assigned
    where: dict[str, object] = {"database_url": "memory:"}
    if backend == "postgres":
        where = {
            "database_url": request.getfixturevalue("database_url"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    clock = SetClock(datetime(2026, 1, 5, 9, 0, tzinfo=UTC))
    with Engine(
        settings=make_settings(routing_file=ranked_routing(tmp_path), **where), clock=clock
    ) as engine:
        engine.register_agent("ann", "Ann", ["golang"], 1)
        engine.register_agent("bob", "Bob", ["golang"], 1)
        engine.create_task("t1", "Fix the race in the Go worker", ["golang"], deadline=timedelta(hours=1))
        clock.now += timedelta(hours=2)
        engine.llm = llm = ScriptedLlm(PICK, usage=USAGE)

        # When it is assigned through the ranked path
        state = await engine.assign_task_ranked("t1")

    # Then it is escalated for its deadline, as it would be whatever the model said, and no
    # model was paid to pick an agent it could not be given to
    assert (state.status, state.escalation.reason if state.escalation else None) == (
        TaskStatus.ESCALATED,
        "deadline_breached",
    )
    assert llm.calls == []


async def test_a_retried_release_is_answered_past_a_ranking_recorded_since(ranked: Engine) -> None:
    # Given a task released, then a ranked assignment whose call is recorded as the task waits
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"])
    ranked.assign_task("t1")
    released = ranked.release_task("t1", "busy")
    ranked.llm = ScriptedLlm(PICK, usage=USAGE, meanwhile=lambda: fill_both(ranked))
    assert (await ranked.assign_task_ranked("t1", escalate_when_full=False)).waiting is not None
    history = [entry.event_type for entry in ranked.task_history("t1")]
    assert history[-2:] == ["Task.Released", "Task.RankingDiscarded"]

    # When the client retries the release whose answer it lost
    again = ranked.release_task("t1", "busy")

    # Then it is answered as the task stands (nothing changed it since), not refused as "pending"
    assert again.status is TaskStatus.PENDING
    assert again.version == released.version + 1  # the ranking's event, nothing else
    assert [entry.event_type for entry in ranked.task_history("t1")] == history


@pytest.mark.postgres
@pytest.mark.parametrize("read", ["raw", "rollups"])
async def test_the_cost_dashboard_counts_a_ranking_call_whose_task_waited(
    database_url: str, pg_schema: str, tmp_path: Path, read: str
) -> None:
    # Given a ranked assignment whose task waited (its agents filled up during the call)
    settings = make_settings(
        database_url=database_url, schema=pg_schema, routing_file=ranked_routing(tmp_path)
    )
    with Engine(settings=settings) as engine:
        engine.register_agent("ann", "Ann", ["golang"], 1)
        engine.register_agent("bob", "Bob", ["golang"], 1)
        since = engine.clock()
        engine.create_task("t1", "Fix the race in the Go worker", ["golang"])
        engine.llm = llm = ScriptedLlm(PICK, usage=USAGE, meanwhile=lambda: fill_both(engine))
        assert (await engine.assign_task_ranked("t1", escalate_when_full=False)).waiting is not None

        # When the cost dashboard is read by step
        projector = projector_for(engine)
        projector.catch_up()
        with projector.connect() as conn:
            rows = dashboard(
                conn, projector.names.reader, tenant="default", since=since, by=["step"], read=read
            )

    # Then its total is what the model was paid: the one call, as skill matching
    assert len(llm.calls) == 1
    assert [(row.group, row.calls, row.cost_usd) for row in rows] == [
        ((TaskStep("skill_matching"),), 1, Decimal(USAGE.cost_usd))
    ]
