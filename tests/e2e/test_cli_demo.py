"""``flowledger demo`` in its short form, end to end: what it prints agrees with the projections.

The demo runs as users run it (a subprocess, the built-in simulator on loopback), in a
schema of the test's own. Its totals come from the event store (scripted sessions) and
from the replies it received (model-calling sessions); the projections it catches up are
queried here on their own and must say the same.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.schemas import drop_schemas, scratch_schema

FLOWLEDGER = str(Path(sys.executable).with_name("flowledger"))
SESSIONS = 5


def printed(output: str, label: str) -> str:
    """The value printed in the table row starting with ``label``."""
    match = re.search(rf"^\W*{re.escape(label)}\s*│\s*(.+?)\s*│", output, re.MULTILINE)
    assert match is not None, f"no row {label!r} in the demo's output"
    return match.group(1)


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def demo(database_url: str, run_schemas: str) -> Iterator[tuple[str, str]]:
    """Run ``flowledger demo --sessions 5`` once; its output and its schema."""
    schema = scratch_schema("demo")
    env = {
        **os.environ,
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": schema,
        # A terminal's usual width: the headings must fit it (one was cut short at 80)
        "COLUMNS": "80",
        "NO_COLOR": "1",
    }
    result = subprocess.run(
        [FLOWLEDGER, "demo", "--sessions", str(SESSIONS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        # Nothing but the demo's own output: no warning about a client left open
        assert "Unclosed" not in result.stderr, result.stderr[-2000:]
        yield result.stdout, schema
    finally:
        drop_schemas(database_url, schema)


def test_every_heading_of_the_demo_is_printed_whole_at_80_columns(demo: tuple[str, str]) -> None:
    output, _ = demo
    # Headings are rules (lines of ─ around a title): none cut short with an ellipsis
    rules = [line for line in output.splitlines() if line.startswith("─") and line.rstrip().endswith("─")]
    assert len(rules) >= 5, rules
    assert [line for line in rules if "…" in line] == []
    # and the simulator's address is said in full
    assert re.search(r"http://127\.0\.0\.1:\d+\b", output)


def totals(database_url: str, schema: str, pattern: str) -> tuple[int, int, int, int, int, Decimal]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*), sum(step_count), sum(failure_count), sum(input_tokens),"
                " sum(output_tokens), sum(cost_usd) FROM {}.sessions WHERE session_id LIKE %s"
            ).format(sql.Identifier(f"{schema}_read")),
            [pattern],
        ).fetchone()
    assert row is not None
    return row  # type: ignore[return-value]


def test_the_demo_runs_to_the_end_and_prints_each_part(demo: tuple[str, str]) -> None:
    output, _ = demo
    for heading in (
        "1. steps whose model calls happened elsewhere",
        "2. steps that call the model",
        "3. tasks classified by the model",
        "4. analytics rebuilt from the log",
        "model calls by model",
    ):
        assert heading in output


def test_the_scripted_sessions_totals_equal_the_current_state_projection(
    demo: tuple[str, str], database_url: str
) -> None:
    output, schema = demo
    run_id = re.search(r"demo run (\d+)", output)
    assert run_id is not None
    sessions, steps, failures, input_tokens, output_tokens, cost = totals(
        database_url, schema, f"demo-{run_id.group(1)}-%"
    )
    assert sessions == number(printed(output, "sessions")) == SESSIONS
    assert steps == number(printed(output, "steps recorded"))
    assert failures == 0
    assert input_tokens == number(printed(output, "input tokens"))
    assert output_tokens == number(printed(output, "output tokens"))
    assert f"${cost:.6f}" == printed(output, "cost (caller-supplied)")


def test_the_model_calling_sessions_totals_equal_the_current_state_projection(
    demo: tuple[str, str], database_url: str
) -> None:
    output, schema = demo
    sessions, steps, failures, input_tokens, output_tokens, cost = totals(database_url, schema, "llm-demo-%")
    recorded, failed = (number(n) for n in printed(output, "steps recorded / failed").split("/"))
    assert sessions == SESSIONS
    assert (steps, failures) == (recorded, failed)
    assert cost == Decimal(printed(output, "total cost (USD, exact)"))
    assert input_tokens == number(printed(output, "input tokens (cached)").split("(")[0])
    assert output_tokens == number(printed(output, "output tokens (reasoning)").split("(")[0])


def table_rows(output: str, title: str, columns: int) -> list[list[str]]:
    """The body rows of the table printed under ``title``, as cells."""
    rows: list[list[str]] = []
    lines = output[output.index(title) :].splitlines()[1:]
    for line in lines:
        if line.startswith("└"):
            break
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if line.startswith("│") and len(cells) == columns:
            rows.append(cells)
    assert rows, f"no rows under {title!r}"
    return rows


def test_the_task_scenarios_sentence_adds_up_to_its_tables(demo: tuple[str, str]) -> None:
    output, _ = demo
    line = re.search(
        r"^waves: (.+)\. In all: (\d+) assignments of (\d+) tasks \((\d+) .*?(\d+) tasks escalated",
        output,
        re.MULTILINE,
    )
    assert line is not None, "no waves line in the demo's output"
    waves, assignments, tasks_assigned, again, escalated = line.groups()
    assigned_in_waves = sum(int(n) for n in re.findall(r"assigned (\d+)", waves))
    escalated_in_waves = sum(int(n) for n in re.findall(r"escalated (\d+)", waves))
    by_priority = table_rows(output, "tasks by priority", 7)
    escalations = table_rows(output, "escalations", 3)
    # Every assignment happened in a wave; a task handed back counts once per assignment
    assert assigned_in_waves == int(assignments) == int(tasks_assigned) + int(again)
    # The tables count tasks: ever assigned, escalated (by priority and by reason alike)
    assert int(tasks_assigned) == sum(int(row[6]) for row in by_priority)
    assert int(escalated) == escalated_in_waves
    assert (
        int(escalated) == sum(int(row[4]) for row in by_priority) == sum(int(row[1]) for row in escalations)
    )
    assert sum(int(row[1]) for row in by_priority) == 100


def test_the_demos_tables_cut_no_cell_at_80_columns(demo: tuple[str, str]) -> None:
    # (The first-assignments table cut every task id to "backend-task-0…" at 80 columns.)
    output, _ = demo
    # Table rows (lines drawn between │): only the last cell, a history's data, a JSON summary
    # cut short on purpose, may hold an ellipsis
    rows = [line.split("│")[1:-1] for line in output.splitlines() if line.startswith("│")]
    cut = ["│".join(cells) for cells in rows if any("…" in cell for cell in cells[:-1])]
    assert len(rows) > 20
    assert cut == [], "\n".join(cut)
