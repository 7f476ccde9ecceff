"""The dashboard grouped by session or workflow counts sessions' calls only: a task's calls, filed
under its task id and the workflow ``tasks``, are the calls with no session and no workflow, not
part of a session that has the same id or a workflow named ``tasks``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest

from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for
from tests.support.simulated_engine import ONE_CENT_CALL, simulated_engine

pytestmark = pytest.mark.postgres

STEP = ONE_CENT_CALL


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    with simulated_engine(database_url, pg_schema) as engine:
        yield engine


async def test_a_task_named_like_a_session_is_not_counted_in_that_sessions_group(engine: Engine) -> None:
    # Given session "x1" with one $0.01 call, and a task also named "x1" classified by a model
    engine.start_session("x1", "cs")
    engine.record_step("x1", "ask", usage=STEP)
    engine.create_task("x1", "Fix the login bug in the Python service")
    classified = await engine.classify_task("x1", "gpt-4.1")
    assert classified.classification is not None
    assert classified.classification.usage is not None
    task_cost = classified.classification.usage.cost_usd
    projector = projector_for(engine)
    projector.catch_up()
    # When the dashboard is grouped by session
    with projector.report() as conn:
        since = engine.clock() - timedelta(hours=1)
        rows = dashboard(conn, projector.names.reader, tenant="default", since=since, by=["session"])
    groups = {row.group: (row.calls, row.cost_usd) for row in rows}
    # Then the session's group holds its one call, as its own totals do, and the task's call is
    # the group of calls with no session (it was one group: 2 calls, $0.01035)
    assert groups[("x1",)] == (1, Decimal("0.01")) == (1, engine.get_session("x1").totals.cost_usd)
    assert groups[(None,)] == (1, task_cost)


@pytest.mark.parametrize("read", ["raw", "rollups"])
async def test_task_calls_are_not_counted_in_a_session_workflow_named_tasks(
    engine: Engine, read: str
) -> None:
    # Given a session of a workflow named "tasks" with one $0.01 call, and a task classified
    engine.start_session("s-1", "tasks")
    engine.record_step("s-1", "ask", usage=STEP)
    engine.create_task("t-1", "Fix the login bug in the Python service")
    classified = await engine.classify_task("t-1", "gpt-4.1")
    assert classified.classification is not None
    assert classified.classification.usage is not None
    projector = projector_for(engine)
    projector.catch_up()
    # When the dashboard is grouped by workflow (from the raw rows or the roll-ups)
    with projector.report() as conn:
        since = engine.clock() - timedelta(hours=1)
        rows = dashboard(
            conn, projector.names.reader, tenant="default", since=since, by=["workflow"], read=read
        )
    groups = {row.group: (row.calls, row.cost_usd) for row in rows}
    # Then the workflow holds its session's call alone, and the task's call has no workflow (the
    # two were one group: 2 calls, $0.01035, for a workflow whose sessions made 1 call of $0.01)
    assert groups == {
        ("tasks",): (1, Decimal("0.01")),
        (None,): (1, classified.classification.usage.cost_usd),
    }
