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
