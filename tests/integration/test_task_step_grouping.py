"""The dashboard grouped by step keeps a task's model calls apart from a session step of the
same name: the router's ``classification``, ``escalation`` and ``skill_matching`` calls are
task steps, a group of their own in the library, in REST and in the CLI's table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.cli.projection_commands import dashboard_table
from flowledger.adapters.group_labels import group_label
from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for
from tests.support.simulated_engine import ONE_CENT_CALL, simulated_engine

pytestmark = pytest.mark.postgres

STEP = ONE_CENT_CALL


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    with simulated_engine(database_url, pg_schema) as engine:
        yield engine


async def _a_session_step_and_a_task_both_named_classification(engine: Engine) -> Decimal:
    """Session s-1's one $0.01 call at its step "classification", and task t-1 classified by a
    model; the task call's cost."""
    engine.start_session("s-1", "cs")
    engine.record_step("s-1", "classification", usage=STEP)
    engine.create_task("t-1", "Fix the login bug in the Python service")
    classified = await engine.classify_task("t-1", "gpt-4.1")
    assert classified.classification is not None
    assert classified.classification.usage is not None
    return classified.classification.usage.cost_usd


@pytest.mark.parametrize("read", ["raw", "rollups"])
async def test_a_session_step_named_classification_is_not_counted_with_the_tasks_classifications(
    engine: Engine, read: str
) -> None:
    # Given a session step and a task's model call both named "classification"
    task_cost = await _a_session_step_and_a_task_both_named_classification(engine)
    projector = projector_for(engine)
    projector.catch_up()
    # When the dashboard is grouped by step (from the raw rows or the roll-ups)
    with projector.report() as conn:
        since = engine.clock() - timedelta(hours=1)
        rows = dashboard(conn, projector.names.reader, tenant="default", since=since, by=["step"], read=read)
    # Then the session's step holds its one call, and the task's call is a group of its own,
    # written apart from any step name (they were one group: 2 calls, $0.01035)
    groups = {row.group: (row.calls, row.cost_usd) for row in rows}
    assert groups.pop(("classification",)) == (1, Decimal("0.01"))
    assert [(tuple(group_label(g, "step") for g in group), n) for group, n in groups.items()] == [
        (("(task classification)",), (1, task_cost))
    ]


async def test_rest_and_the_cli_keep_a_task_step_apart_from_a_session_step_of_its_name(
    engine: Engine,
) -> None:
    # Given a session step and a task's model call both named "classification"
    task_cost = await _a_session_step_and_a_task_both_named_classification(engine)
    # When REST's dashboard is read by step
    with TestClient(create_app(engine)) as client:
        answer = client.get("/v1/dashboard", params={"by": "step", "since": "1h"})
    # Then the task's call is its own group, a JSON object no step name can be
    assert answer.status_code == 200, answer.text
    assert [(row["group"], row["calls"], row["cost_usd"]) for row in answer.json()] == [
        (["classification"], 1, "0.01"),
        ([{"task_step": "classification"}], 1, str(task_cost)),
    ]
    # And the CLI's table writes it as no step name is written (a step named so is quoted)
    projector = projector_for(engine)
    with projector.report() as conn:
        since = engine.clock() - timedelta(hours=1)
        rows = dashboard(conn, projector.names.reader, tenant="default", since=since, by=["step"])
    table = dashboard_table(rows, ["step"], "model calls")
    assert list(table.columns[0].cells) == ["classification", "(task classification)"]
