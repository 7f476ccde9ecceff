"""``flowledger agents`` and ``flowledger tasks`` end to end: the seed's teams and a few tasks
through the command line (classified by the built-in simulator, assigned, listed with filters,
swept, completed, an escalated one requeued and assigned again), and bad input refused with
one line and an exit code, nothing recorded."""

from __future__ import annotations

import socket
import subprocess
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL
from tests.conftest import make_settings
from tests.support.cli import run_cli

TEAMS = {
    "backend": ["python", "golang", "kubernetes"],
    "frontend": ["react", "vue", "css"],
    "devops": ["terraform", "aws", "docker"],
}


def stored_events(database_url: str, schema: str) -> int:
    """Rows in the schema's events tables (0 when there are none yet)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE '%%\\_events'",
            [schema],
        ).fetchall()
        total = 0
        for (table,) in tables:
            query = sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            row = conn.execute(query).fetchone()
            total += row[0] if row is not None else 0
        return total


def listed(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The first cell of each row of the table a command printed (a row folded onto more
    lines, in 80 columns, continues with an empty first cell)."""
    assert result.returncode == 0, result.stderr
    cells = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    return [cell for cell in cells if cell]


def said(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a command printed (after a zero exit)."""
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    return line


def test_the_seed_scenario_through_the_command_line(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=model, columns=80)

    # Given the seed's three teams, at the seed's default capacity
    for agent_id, skills in TEAMS.items():
        skill_options = [word for skill in skills for word in ("--skill", skill)]
        line = said(cli("agents", "register", agent_id, "--name", agent_id.title(), *skill_options))
        assert line.endswith("load 0/10 registered"), line
    again = ["agents", "register", "backend", "--name", "Backend", "--skill", "python", "--skill", "golang"]
    assert cli(*again, "--skill", "kubernetes").stdout.strip().endswith("already registered")
    assert listed(cli("agents", "list")) == list(TEAMS)

    # When a critical task without skills is classified by the model and assigned
    created = said(
        cli(
            "tasks",
            "create",
            "T-go",
            "--description",
            "Fix the crash in the Go worker 1",
            "--priority",
            "CRITICAL",
        )
    )
    assert created == "task 'T-go' pending: critical, no skills yet"
    classified = said(cli("tasks", "classify", "T-go"))
    assert classified.startswith("task 'T-go' pending: critical, golang"), classified
    assert said(cli("tasks", "assign", "T-go")).startswith("task 'T-go' assigned: agent 'backend'")

    # And tasks with skills, one nobody has, one long overdue, go through the queue and the sweep
    cli(
        "tasks",
        "create",
        "T-css",
        "--description",
        "Fix the layout",
        "--skill",
        "css",
        "--priority",
        "Medium",
        "--deadline-hours",
        "2",
    )
    cli(
        "tasks",
        "create",
        "T-helm",
        "--description",
        "Write the Helm chart",
        "--skill",
        "helm",
        "--priority",
        " HIGH",
    )
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    cli(
        "tasks",
        "create",
        "T-late",
        "--description",
        "Late work",
        "--skill",
        "aws",
        "--priority",
        "low",
        "--deadline",
        past,
    )
    assert listed(cli("tasks", "list", "--overdue")) == ["T-late"]
    swept = cli("tasks", "sweep")
    assert listed(swept) == ["T-late"]
    assert "deadline sweep: 1 escalated" in swept.stdout
    ran = cli("tasks", "run-queue")
    assert "queue run: 2 offered, 1 assigned, 1 escalated, 0 waiting" in ran.stdout
    assert set(listed(ran)) == {"T-css", "T-helm"}

    # Then the list filters as REST's do
    assert listed(cli("tasks", "list", "--status", "ASSIGNED")) == ["T-go", "T-css"]
    assert listed(cli("tasks", "list", "--priority", "high")) == ["T-helm"]
    assert listed(cli("tasks", "list", "--agent", "frontend")) == ["T-css"]
    assert listed(cli("tasks", "list", "--status", "escalated")) == ["T-helm", "T-late"]
    assert listed(cli("tasks", "list", "--limit", "1", "--after", "T-go")) == ["T-css"]
    shown = cli("tasks", "show", "T-helm")
    assert "no_capable_agent" in shown.stdout
    assert "helm" in shown.stdout

    # When work completes, the agent is freed and the task lists as what it finished
    assert said(cli("tasks", "start", "T-go")).startswith("task 'T-go' in_progress")
    assert (
        said(cli("tasks", "complete", "T-go", "--result", '{"pr": 42}'))
        == "task 'T-go' completed: {\"pr\": 42}"
    )
    assert listed(cli("tasks", "list", "--status", "completed", "--agent", "backend")) == ["T-go"]
    assert "0/10" in said(cli("agents", "capacity", "backend", "10"))
    done = said(cli("tasks", "complete", "T-css", "--resolution", '"fixed"'))
    assert done == 'task \'T-css\' completed: {"resolution": "fixed"}'

    # And a person requeues the escalated ones once someone can take them
    cli("agents", "register", "platform", "--name", "Platform", "--skill", "helm", "--capacity", "1")
    requeued = said(
        cli("tasks", "requeue", "T-helm", "--by", "alice@example.com", "--reason", "Platform joined")
    )
    assert requeued.startswith("task 'T-helm' pending")
    late = cli("tasks", "requeue", "T-late", "--by", "alice@example.com", "--reason", "again")
    assert late.returncode == 2, late.stderr  # its deadline passed: a new one is needed
    assert said(
        cli("tasks", "requeue", "T-late", "--by", "bob", "--reason", "again", "--deadline-hours", "4")
    )
    ran = cli("tasks", "run-queue")
    assert "2 offered, 2 assigned" in ran.stdout
    assert "platform" in cli("tasks", "show", "T-helm").stdout
    assert listed(cli("tasks", "list", "--agent", "platform")) == ["T-helm"]
    assert listed(cli("tasks", "list", "--agent", "devops")) == ["T-late"]
    history = cli("tasks", "history", "T-helm")
    assert "Task.Requeued" in history.stdout
    assert "T-helm" in cli("agents", "show", "platform").stdout


# (arguments, exit code, the one line's text) on a roster of one agent and one waiting task
BAD_INPUT = [
    (["tasks", "show", "nope"], 3, "task 'nope' not found"),
    (["tasks", "assign", "nope"], 3, "task 'nope' not found"),
    (["tasks", "complete", "nope"], 3, "task 'nope' not found"),
    (["tasks", "requeue", "nope", "--by", "a", "--reason", "r"], 3, "task 'nope' not found"),
    (["agents", "show", "nope"], 3, "agent 'nope' not found"),
    (["agents", "capacity", "nope", "3"], 3, "agent 'nope' not found"),
    (["tasks", "create", "T-2", "--description", "d", "--priority", "urgent"], 2, "priority: must be one of"),
    (["tasks", "list", "--priority", "urgent"], 2, "priority: must be one of"),
    (["tasks", "list", "--status", "bogus"], 2, "status: must be one of"),
    (["tasks", "list", "--overdue", "--status", "completed"], 2, "overdue: looks at open tasks only"),
    (
        ["tasks", "list", "--agent", "backend", "--status", "pending"],
        2,
        "status=pending tasks are held by no",
    ),
    (
        ["agents", "register", "a-2", "--name", "n", "--skill", "python", "--capacity", "0"],
        2,
        "capacity: must be an int in [1, 10000], got 0",
    ),
    (
        ["agents", "register", "a-2", "--name", "n", "--skill", "python", "--capacity", "-3"],
        2,
        "capacity: must be an int in [1, 10000], got -3",
    ),
    (["agents", "register", "a-2", "--name", "n"], 2, "Missing option '--skill'"),
    (["agents", "register", "a-2", "--name", "n", "--skill", " "], 2, "skills: must be a non-empty string"),
    (["agents", "capacity", "backend", "--", "-1"], 2, "capacity: must be an int in [0, 10000], got -1"),
    # Without "--", click took "-1" for an option: "No such option: -1", not the capacity's rule
    (["agents", "capacity", "backend", "-1"], 2, "capacity: must be an int in [0, 10000], got -1"),
    (["agents", "capacity", "backend", "-2.5"], 2, "Invalid value for 'capacity'"),
    (["agents", "capacity", "backend", "-x"], 2, "No such option: -x"),
    (["agents", "capacity", "backend", "ten"], 2, "Invalid value for 'capacity'"),
    (
        ["tasks", "create", "T-2", "--description", "d", "--deadline", "tomorrow"],
        2,
        "deadline: 'tomorrow' is not an RFC 3339 time",
    ),
    (
        ["tasks", "create", "T-2", "--description", "d", "--deadline", "2030-01-01T10:00:00"],
        2,
        "deadline: must carry a time zone (like +00:00 or Z), got 2030-01-01T10:00:00",
    ),
    (
        ["tasks", "create", "T-2", "--description", "d", "--deadline-hours", "-1"],
        2,
        "deadline_hours: must be a positive number of hours",
    ),
    (["tasks", "create", "T-2", "--description", "d", "--deadline-hours", "1e9"], 2, "deadline"),
    # A deadline's bound is MAX_DEADLINE (87840 hours, as REST's deadline_hours says), not a
    # session's 366 days: "inf hours reach past any expiry (at most 8784 ahead)" named the wrong one
    *(
        (
            ["tasks", "create", "T-2", "--description", "d", "--deadline-hours", hours],
            2,
            f"deadline_hours: must be at most 87840 (3660 days), got {hours}",
        )
        for hours in ("87841", "1e+300", "inf")
    ),
    (
        ["tasks", "requeue", "T-1", "--by", "a", "--reason", "r", "--deadline-hours", "inf"],
        2,
        "deadline_hours: must be at most 87840 (3660 days), got inf",
    ),
    (
        [
            "tasks",
            "create",
            "T-2",
            "--description",
            "d",
            "--deadline",
            "2030-01-01T10:00:00+00:00",
            "--deadline-hours",
            "1",
        ],
        2,
        "deadline_hours: give deadline (a time) or deadline_hours, not both",
    ),
    (["tasks", "create", "T-1", "--description", "other words"], 4, "T-1"),
    (["tasks", "complete", "T-1", "--result", '{"pr": 42'], 2, "resolution: must be JSON"),
    (["tasks", "complete", "T-1", "--result", "[1, 2]"], 2, "resolution: must be a string or a JSON object"),
    (["tasks", "complete", "T-1", "--result", '{"pr": 42}'], 4, "T-1"),  # waiting: nobody holds it
    (["tasks", "requeue", "T-1", "--by", "a", "--reason", "r"], 4, "T-1"),  # not escalated
    (["tasks", "requeue", "T-1", "--by", " ", "--reason", "r"], 2, "requested_by"),
    (["tasks", "classify", "T-1"], 7, "no model configured: set FLOWLEDGER_LLM_BASE_URL"),
    # REST's bound on a queue run (POST /v1/queue/run {"limit": 1001} is a 422): the CLI took any
    (["tasks", "run-queue", "--limit", "1001"], 2, "limit: must be in [1, 1000], got 1001"),
    (["tasks", "run-queue", "--limit", "0"], 2, "limit: must be in [1, 1000], got 0"),
    (["tasks", "list", "--limit", "1001"], 2, "limit: must be in [1, 1000], got 1001"),
]


def test_bad_input_is_one_line_an_exit_code_and_nothing_recorded(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    no_model = {"FLOWLEDGER_LLM_BASE_URL": ""}

    def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=env or no_model, columns=80)

    assert cli("agents", "register", "backend", "--name", "B", "--skill", "python").returncode == 0
    assert cli("tasks", "create", "T-1", "--description", "Fix the API").returncode == 0
    before = stored_events(database_url, pg_schema)
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}
    cases = [*BAD_INPUT, (["tasks", "classify", "T-1", "--model", "no-such-model"], 2, "no-such-model")]
    for args, code, message in cases:
        result = cli(*args, env=model if "--model" in args else None)
        lines = result.stderr.splitlines()
        assert (result.returncode, len(lines)) == (code, 1), (args, result.returncode, result.stderr)
        assert lines[0].startswith("error: "), (args, lines[0])
        assert message in lines[0], (args, lines[0])
        assert result.stdout == "", (args, result.stdout)
        assert stored_events(database_url, pg_schema) == before, args


def test_a_classification_whose_model_is_unreachable_exits_7_and_the_task_waits(
    database_url: str, pg_schema: str
) -> None:
    # Given a task without skills, and a model endpoint nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = {
        "FLOWLEDGER_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "FLOWLEDGER_LLM_API_KEY": "sk-unreachable",
    }
    cli = lambda *args: run_cli(database_url, pg_schema, *args, env=model, columns=80)  # noqa: E731
    assert cli("tasks", "create", "T-1", "--description", "Fix the Go worker").returncode == 0

    # When it is classified
    result = cli("tasks", "classify", "T-1")

    # Then the command says so in one line, exit 7 (REST answers the task as it stands) ...
    assert result.returncode == 7, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: task 'T-1' was not classified ("), line
    assert line.endswith("the failed calls are recorded and it waits; reclassify it"), line
    # ... and the task waits, held back, the failures in its history
    assert "held back" in cli("tasks", "show", "T-1").stdout
    assert "Task.ClassificationFailed" in cli("tasks", "history", "T-1").stdout


def test_a_listing_cut_at_its_limit_says_how_to_read_the_next_page(database_url: str, pg_schema: str) -> None:
    # Given three tasks
    cli = lambda *args: run_cli(database_url, pg_schema, *args, columns=120)  # noqa: E731
    for n in (1, 2, 3):
        assert cli("tasks", "create", f"T-{n}", "--description", "Fix the API").returncode == 0
    # When they are listed two at a time
    first = cli("tasks", "list", "--limit", "2")
    # Then the page says more follow and how to read them (it printed two rows, nothing more,
    # as if there were no others: the default limit is 100)
    assert listed(first) == ["T-1", "T-2"]
    assert "more after T-2: add --after T-2" in first.stdout
    # And the last page, or one that holds everything, says nothing of the kind
    last = cli("tasks", "list", "--limit", "2", "--after", "T-2")
    assert listed(last) == ["T-3"]
    assert "more after" not in last.stdout
    everything = cli("tasks", "list", "--limit", "3")
    assert listed(everything) == ["T-1", "T-2", "T-3"]
    assert "more after" not in everything.stdout


def test_classifying_a_task_that_needs_no_call_says_nothing_was_done(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}
    cli = lambda *args: run_cli(database_url, pg_schema, *args, env=model, columns=200)  # noqa: E731
    # Given a classified task, and an escalated one never classified
    assert cli("tasks", "create", "T-1", "--description", "Fix the Go worker").returncode == 0
    assert "nothing done" not in said(cli("tasks", "classify", "T-1"))
    assert cli("tasks", "create", "T-2", "--description", "Port it", "--skill", "cobol").returncode == 0
    assert "escalated" in said(cli("tasks", "assign", "T-2"))
    before = stored_events(database_url, pg_schema)
    # When each is classified (again)
    again, closed = said(cli("tasks", "classify", "T-1")), said(cli("tasks", "classify", "T-2"))
    # Then each line says that no classification was made, and why (both printed the task's
    # line alone, exit 0, as if it had been classified), and nothing is recorded
    assert again.endswith("(already classified: nothing done; reclassify classifies again)"), again
    assert closed.endswith("(not classified: it is escalated; nothing done)"), closed
    assert stored_events(database_url, pg_schema) == before


def test_the_dashboard_prints_the_tier_what_if_with_tiers(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=model, columns=160)

    # Given a critical task and a low one, classified on their tiers' models
    for task_id, priority in (("T-1", "critical"), ("T-2", "low")):
        said(cli("tasks", "create", task_id, "--description", "Fix the Go worker", "--priority", priority))
        said(cli("tasks", "classify", task_id))
    # When the dashboard is asked for the tiers
    shown = cli("dashboard", "--since", "1h", "--tiers")
    # Then it prints each policy's model per priority, with the calls counted, its cost and saving
    assert shown.returncode == 0, shown.stderr
    assert "task calls, last 1h: 2 recorded at $" in shown.stdout
    assert "saving against all claude-sonnet-4.5" in shown.stdout
    rows = {
        cells[0]: cells[1:]
        for line in shown.stdout.splitlines()
        if line.startswith("│") and len(cells := [c.strip() for c in line.strip("│").split("│")]) == 7
    }
    # (a priority without calls prices nothing: no model named for it)
    assert rows["configured"][:4] == ["claude-sonnet-4.5", "-", "-", "gemini-2.5-flash"]
    assert rows["all claude-sonnet-4.5"][-1] == "0.0%"
    assert 0 < float(rows["configured"][-1].rstrip("%")) < 100
    assert "critical (1)" in shown.stdout
    assert "low (1)" in shown.stdout
    # and without --tiers, no such table
    assert "tier policy" not in cli("dashboard", "--since", "1h").stdout


def test_the_tier_what_if_keeps_every_cost_and_model_whole_at_80_columns(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}

    def cli(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=model, columns=columns)

    # Given a task of each priority, classified on their tiers' models
    for task_id, priority in (("T-1", "critical"), ("T-2", "high"), ("T-3", "medium"), ("T-4", "low")):
        said(cli("tasks", "create", task_id, "--description", "Fix it", "--priority", priority))
        said(cli("tasks", "classify", task_id))
    # When the tier what-if is printed 80 columns wide (a terminal's usual width, and rich's
    # for a pipe)
    shown = cli("dashboard", "--since", "1h", "--tiers", columns=80)
    # Then no cell is cut short: a cost read "0.01562…" and a model "claude-s…"
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("task calls, last 1h") :]
    assert "…" not in table


def test_a_queue_run_without_a_model_leaves_an_unclassified_task_waiting_as_rest_does(
    database_url: str, pg_schema: str
) -> None:
    # (Without FLOWLEDGER_LLM_BASE_URL the run gave "Fix the race in the Go worker", created
    # without skills, to whichever agent had room, "covers no particular skills", where a
    # server, which always has a model, classified it first and sent it to Backend.)
    no_model = {"FLOWLEDGER_LLM_BASE_URL": ""}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env=no_model)

    for team, skills in TEAMS.items():
        skill_options = [f"--skill={skill}" for skill in skills]
        assert cli("agents", "register", team, "--name", team, *skill_options).returncode == 0
    assert cli("tasks", "create", "T-1", "--description", "Fix the race in the Go worker").returncode == 0
    assert cli("tasks", "create", "T-2", "--description", "Style the login", "--skill", "css").returncode == 0

    ran = cli("tasks", "run-queue")

    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "queue run: 2 offered, 1 assigned, 0 escalated, 1 waiting (1 held back)"
    assert f"task 'T-1' pending: held back ({UNCLASSIFIED_NO_MODEL})" in lines
    assert lines[-1].startswith("to classify them: no model configured: set FLOWLEDGER_LLM_BASE_URL")
    # And shown or listed, it says it is held back, and why, as the run did (it showed no hold)
    shown = cli("tasks", "show", "T-1")
    assert shown.returncode == 0, shown.stderr
    assert "held back" in shown.stdout
    assert "no model is configured" in " ".join(shown.stdout.split())
    assert "pending (held back)" in cli("tasks", "list", "--status", "pending").stdout
    assert listed(cli("tasks", "list", "--status", "assigned")) == ["T-2"]
    # And assigning it by name is refused, one line, exit 4, nothing recorded
    assigned = cli("tasks", "assign", "T-1")
    refused = f"error: cannot assign task 'T-1': {UNCLASSIFIED_NO_MODEL}\n"
    assert (assigned.returncode, assigned.stderr) == (4, refused)
    assert len(listed(cli("tasks", "history", "T-1"))) == 1
    # And given to an agent by the library's synchronous rule, then released, it is held back again
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        assert engine.assign_task("T-1").status.value == "assigned"
    released = cli("tasks", "release", "T-1")
    assert released.returncode == 0, released.stderr
    assert released.stdout.startswith(f"task 'T-1' pending: held back ({UNCLASSIFIED_NO_MODEL})")


def test_a_command_refused_for_a_task_no_agent_holds_names_its_state_and_the_assignment_sent_for(
    database_url: str, pg_schema: str
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env={"FLOWLEDGER_LLM_BASE_URL": ""})

    assert cli("agents", "register", "backend", "--name", "B", "--skill", "golang").returncode == 0
    assert cli("tasks", "create", "T-1", "--description", "Fix it", "--skill", "golang").returncode == 0
    cases = [
        (
            ["complete", "T-1", "--assignment", "1"],
            "cannot complete task 'T-1' (sent for assignment 1): it is pending, never assigned"
            " (no agent holds it); nothing done",
        ),
        (["release", "T-1"], "cannot release task 'T-1': it is pending, never assigned (no agent holds it)"),
    ]
    for args, message in cases:
        result = cli("tasks", *args)
        assert (result.returncode, result.stderr) == (4, f"error: {message}\n"), args
    assert cli("tasks", "assign", "T-1").returncode == 0
    assert cli("tasks", "release", "T-1", "--reason", "restart").returncode == 0
    result = cli("tasks", "start", "T-1", "--agent", "backend", "--assignment", "1")
    assert (result.returncode, result.stderr) == (
        4,
        "error: cannot start task 'T-1' (sent for assignment 1 of agent 'backend'): it is pending,"
        " back in the queue after assignment 1 (no agent holds it); nothing done\n",
    )


def test_a_queue_run_names_each_task_it_left_waiting_for_capacity_and_why(
    database_url: str, pg_schema: str
) -> None:
    # (The run's table said "pending" and its head "1 waiting", with no word of why, where
    # REST's answer now says it in ``waiting``.)
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env={"FLOWLEDGER_LLM_BASE_URL": ""})

    registered = cli("agents", "register", "be", "--name", "Backend", "--skill", "python", "--capacity", "1")
    assert registered.returncode == 0, registered.stderr
    for task_id in ("T-1", "T-2"):
        assert cli("tasks", "create", task_id, "--description", "Fix it", "--skill", "python").returncode == 0

    ran = cli("tasks", "run-queue")

    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "queue run: 2 offered, 1 assigned, 0 escalated, 1 waiting"
    assert lines[-1] == "task 'T-2' pending: waiting (the 1 capable agent is at capacity: be 1/1)"
    assert "pending (waiting)" in ran.stdout


def test_a_queue_run_says_why_it_escalated_each_task_it_escalated(database_url: str, pg_schema: str) -> None:
    # (The run's table said "escalated" with no reason, where REST's answer carries the
    # escalation's reason and detail: a person had to `tasks show` each one to learn it.)
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(database_url, pg_schema, *args, env={"FLOWLEDGER_LLM_BASE_URL": ""})

    assert cli("agents", "register", "be", "--name", "Backend", "--skill", "python").returncode == 0
    assert cli("tasks", "create", "T-rs", "--description", "Fix it", "--skill", "rust").returncode == 0

    ran = cli("tasks", "run-queue")

    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "queue run: 1 offered, 0 assigned, 1 escalated, 0 waiting"
    assert lines[-1] == "task 'T-rs' escalated: no_capable_agent (the 1 agent registered does not cover rust)"
