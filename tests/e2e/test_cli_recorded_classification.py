"""``flowledger tasks record-classification``: a classification made elsewhere, recorded from the
command line as ``Engine.record_classification`` records it (the first one recorded stands).
Without a model a task that names no skills is held back, "classify it (or record a
classification) first", but ``tasks classify`` exits 7 without one and no command took a
classification: the task could never be assigned by ``tasks run-queue``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL
from tests.e2e.test_cli_tasks import TEAMS, listed, said, stored_events
from tests.support.cli import run_cli

NO_MODEL = {"FLOWLEDGER_LLM_BASE_URL": ""}
RECORD = ["tasks", "record-classification"]
GO_BUG = ["--category", "bug_fix", "--complexity", "medium", "--hours", "3"]
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(database_url: str, pg_schema: str) -> Cli:
    """``flowledger`` on the test's schema without a model, the seed's teams and a Go bug created
    without skills."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=NO_MODEL, columns=80)

    for team, skills in TEAMS.items():
        assert (
            run("agents", "register", team, "--name", team, *[f"--skill={s}" for s in skills]).returncode == 0
        )
    assert run("tasks", "create", "T-1", "--description", "Fix the race in the Go worker").returncode == 0
    return run


def test_a_recorded_classification_lets_the_queue_run_assign_the_task_held_back_without_a_model(
    cli: Cli,
) -> None:
    # Given a Go bug without skills, held back by a run without a model, which says how to
    # classify it: configure a model, or record a classification
    ran = cli("tasks", "run-queue")
    assert f"task 'T-1' pending: held back ({UNCLASSIFIED_NO_MODEL})" in ran.stdout.splitlines()
    hint = ran.stdout.splitlines()[-1]
    assert hint.startswith("to classify them: no model configured: set FLOWLEDGER_LLM_BASE_URL"), hint
    assert "or record a classification made elsewhere: flowledger tasks record-classification" in hint
    # (and classify, with no model, says so too)
    classify = cli("tasks", "classify", "T-1")
    assert classify.returncode == 7
    assert "flowledger tasks record-classification" in classify.stderr

    # When a classification made elsewhere is recorded
    line = said(cli(*RECORD, "T-1", *GO_BUG))

    # Then its line says it was recorded, held back no more, with the skills it derived
    assert line == "task 'T-1' pending: medium, golang (classification recorded: bug_fix, medium, 3 h)"
    assert "bug_fix, medium, 3 h" in cli("tasks", "show", "T-1").stdout
    # And the next run assigns it by them
    again = cli("tasks", "run-queue")
    assert again.stdout.splitlines()[0] == "queue run: 1 offered, 1 assigned, 0 escalated, 0 waiting"
    assert listed(cli("tasks", "list", "--status", "assigned")) == ["T-1"]
    assert "backend" in cli("tasks", "show", "T-1").stdout


def test_a_second_recording_says_the_first_one_stands_and_records_nothing(
    cli: Cli,
    database_url: str,
    pg_schema: str,
) -> None:
    said(cli(*RECORD, "T-1", *GO_BUG))
    before = stored_events(database_url, pg_schema)
    for other in (GO_BUG, ["--category", "Research", "--complexity", "LOW", "--hours", "0.5"]):
        line = said(cli(*RECORD, "T-1", *other))
        assert line.endswith(
            " (already classified as bug_fix, medium, 3 h:"
            " the first classification recorded stands; nothing done)"
        ), line
    assert stored_events(database_url, pg_schema) == before


def test_a_closed_task_takes_no_classification_and_says_so(
    cli: Cli,
    database_url: str,
    pg_schema: str,
) -> None:
    assert cli("tasks", "create", "T-2", "--description", "Port it", "--skill", "cobol").returncode == 0
    assert "escalated" in said(cli("tasks", "assign", "T-2"))
    before = stored_events(database_url, pg_schema)
    line = said(cli(*RECORD, "T-2", *GO_BUG))
    assert line.endswith(" (not classified: it is escalated; nothing done)"), line
    assert stored_events(database_url, pg_schema) == before


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([*RECORD, "T-404", *GO_BUG], 3, "T-404"),
        (
            [*RECORD, "T-1", "--category", "bugfix", "--complexity", "low", "--hours", "1"],
            2,
            "category: must be one of",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "huge", "--hours", "1"],
            2,
            "complexity: must be one of",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "low", "--hours", "0"],
            2,
            "estimated_hours: must be above 0, got 0",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "low", "--hours", "-2"],
            2,
            "estimated_hours: must be above 0, got -2",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "low", "--hours", "10000.5"],
            2,
            "estimated_hours: must be at most 10000, got 10000.5",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "low", "--hours", "nan"],
            2,
            "estimated_hours: must be a number, got nan",
        ),
        (
            [*RECORD, "T-1", "--category", "review", "--complexity", "low", "--hours", "3h"],
            2,
            "Invalid value for '--hours'",
        ),
        ([*RECORD, "T-1", "--category", "review", "--complexity", "low"], 2, "Missing option '--hours'"),
        ([*RECORD, "T-1", "--complexity", "low", "--hours", "1"], 2, "Missing option '--category'"),
        ([*RECORD, "T-1", *GO_BUG, "--model", "gpt-4.1"], 2, "No such option: --model"),
    ],
    ids=repr,
)
def test_bad_input_is_one_line_an_exit_code_and_nothing_recorded(
    cli: Cli,
    database_url: str,
    pg_schema: str,
    args: list[str],
    code: int,
    message: str,
) -> None:
    before = stored_events(database_url, pg_schema)
    result = cli(*args)
    lines = result.stderr.splitlines()
    assert (result.returncode, len(lines), result.stdout) == (code, 1, ""), result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert message in lines[0], lines[0]
    assert stored_events(database_url, pg_schema) == before
