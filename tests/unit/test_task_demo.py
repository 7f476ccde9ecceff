"""The task-assignment demo scenario runs end to end and leaves consistent state."""

from __future__ import annotations

import io

from rich.console import Console

from flowledger.adapters.cli.demo.tasks import run_task_scenario
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm

FEATURE = '{"category": "feature", "complexity": "medium", "estimated_hours": 3}'
"""Every task a medium feature of three hours."""


def test_the_scenario_prints_assignments_escalations_and_loads_within_capacity() -> None:
    # Given an engine and a console that records
    out = io.StringIO()
    console = Console(file=out, width=160)
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        # When the scenario runs without an LLM adapter
        summary = run_task_scenario(engine, console)

    # Then a hundred tasks were decided, every escalation reason but one shows up,
    # and no agent holds more than its capacity
    text = out.getvalue()
    assert summary.tasks == 100
    assert summary.classification_source == "task data"
    assert "classifications are taken from the task data" in text
    assert set(summary.escalated) == {"no_capable_agent", "all_at_capacity", "deadline_breached"}
    assert summary.assigned + sum(summary.escalated.values()) >= summary.tasks
    assert all(load <= capacity for load, capacity in summary.agent_load.values())
    for title in ("first assignments", "tasks by priority", "escalations", "per-agent load"):
        assert title in text


def test_the_scenario_classifies_through_the_llm_port_when_given_one() -> None:
    out = io.StringIO()
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        summary = run_task_scenario(engine, Console(file=out, width=160), llm=ScriptedLlm(FEATURE))
    assert summary.classification_source == "the LLM adapter"
    assert "classification_failed" not in summary.escalated


def test_each_row_of_the_priority_table_adds_up_to_its_tasks() -> None:
    # Given the scenario's printed tables (a task handed back may later be escalated)
    out = io.StringIO()
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        run_task_scenario(engine, Console(file=out, width=160))
    text = out.getvalue()
    lines = text[text.index("tasks by priority") :].splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    columns = [cell.strip() for cell in header.strip("┃ ").split("┃")]
    rows = []
    for line in lines[1:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│ ").split("│")]
            rows.append(dict(zip(columns, cells, strict=True)))

    # Then every task is counted once by where it stands: held by an agent, completed,
    # escalated or waiting; the tasks ever assigned are a column of their own
    assert len(rows) == 4
    for row in rows:
        standing = sum(int(row[name]) for name in ("held", "completed", "escalated", "waiting"))
        assert standing == int(row["tasks"]), row
        assert int(row["ever assigned"]) >= int(row["held"]) + int(row["completed"])
