"""What a command says in one line stays one line when its output is piped or captured.

rich takes a stream that is not a terminal to be 80 columns wide and used to wrap every
message there: ``flowledger extend <a long id> --hours 1 | cat`` broke the line after
"(it was", and a script grepping for it found half. Tables still fit the width.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

LONG_ID = "session-" + "x" * 120
LONG_WORKFLOW = "workflow-" + "w" * 150


def run(database_url: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``flowledger *args`` as a pipe sees it: 80 columns, not a terminal."""
    return run_cli(database_url, schema, *args, columns=80)


def one_line(result: subprocess.CompletedProcess[str], stream: str = "stdout") -> str:
    """The command's only line on ``stream`` (after a zero exit)."""
    assert result.returncode == 0, result.stderr
    lines = getattr(result, stream).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_session_messages_stay_on_one_line(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWLEDGER_SEAL_PERSONAL_DATA", "1")  # so that `forget` erases it
    sealed = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=sealed) as engine:
        engine.start_session(LONG_ID, "customer_service", user_id="u-1")

    extended = one_line(run(database_url, pg_schema, "extend", LONG_ID, "--hours", "1"))
    assert extended.startswith(f"session {LONG_ID!r} now expires at ")
    assert "(it was " in extended

    forgotten = one_line(run(database_url, pg_schema, "forget", "--session", LONG_ID))
    assert forgotten == f"erased 1 sessions ({LONG_ID}); 1 data keys destroyed"


def test_policy_budget_and_funnel_messages_stay_on_one_line(database_url: str, pg_schema: str) -> None:
    kept = one_line(
        run(database_url, pg_schema, "retention", "set", "--workflow", LONG_WORKFLOW, "--days", "30")
    )
    assert kept == f"retention of {LONG_WORKFLOW}: 30 days"
    removed = one_line(run(database_url, pg_schema, "retention", "remove", "--workflow", LONG_WORKFLOW))
    assert removed == f"retention of {LONG_WORKFLOW} removed"

    budget = one_line(
        run(
            database_url,
            pg_schema,
            "budgets",
            "set",
            "workflow",
            LONG_WORKFLOW,
            "--limit",
            "5",
            "--period",
            "day",
        )
    )
    assert budget == f"budget workflow:{LONG_WORKFLOW} per day: $5 (enforce) set"
    gone = one_line(run(database_url, pg_schema, "budgets", "remove", "workflow", LONG_WORKFLOW))
    assert gone == f"budget workflow:{LONG_WORKFLOW} per day removed"

    nothing = one_line(run(database_url, pg_schema, "funnel", LONG_WORKFLOW))
    assert nothing == f"no sessions of workflow {LONG_WORKFLOW!r}"


def test_a_keys_note_stays_on_one_line(database_url: str, pg_schema: str) -> None:
    tenant = "t" * 100
    created = run(database_url, pg_schema, "keys", "create", "--tenant", tenant, "--role", "writer")
    note = one_line(created, "stderr")
    assert note.startswith("key ")
    assert note.endswith(f" for {tenant!r} as writer, shown this once:")
    key_id = note.split()[1]
    revoked = one_line(run(database_url, pg_schema, "keys", "revoke", key_id))
    assert revoked == f"key {key_id} revoked"


def test_an_error_stays_on_one_line(database_url: str, pg_schema: str) -> None:
    result = run(database_url, pg_schema, "history", LONG_ID)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [f"error: session {LONG_ID!r} not found"]


def test_tables_still_fit_the_width(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        engine.record_step("s-1", "greet", context_update={"note": "n" * 300})
    history = run(database_url, pg_schema, "history", "s-1")
    assert history.returncode == 0, history.stderr
    assert max(len(line) for line in history.stdout.splitlines()) <= 80


def test_a_command_with_a_progress_bar_prints_no_blank_line_where_it_was_when_piped(
    database_url: str, pg_schema: str
) -> None:
    # Given a session whose middle row was deleted in the database
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        for step in ("a", "b"):
            engine.record_step("s-1", step)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            SQL("DELETE FROM {} WHERE originator_version = 2").format(
                Identifier(pg_schema, "flowledger_events")
            )
        )
    # When a rebuild and a verification run piped (their progress bars are transient)
    rebuilt = run(database_url, pg_schema, "projections", "rebuild")
    verified = run(database_url, pg_schema, "audit", "verify")
    # Then the refusal is the first and only line, with no blank line left by the bar before it
    assert rebuilt.returncode == 65
    assert rebuilt.stderr.splitlines() == [rebuilt.stderr.strip()], rebuilt.stderr
    assert rebuilt.stderr.startswith("error: a stored event is missing: stream ")
    assert verified.returncode == 1
    assert verified.stderr.startswith("problem: deleted: stream "), verified.stderr


def test_a_follower_says_it_lost_the_database_on_one_line(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``projections follow`` announces each lost connection; psycopg's message for a
    connection the server closed runs over three lines (as a follower whose backends were
    ended printed it), so its log held the announcement in three pieces."""
    closed = psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly\n"
        "\tThis probably means the server terminated abnormally\n"
        "\tbefore or while processing the request."
    )
    tries: list[int] = []

    def follow_losing_the_database(*_: object, stop: threading.Event, **__: object) -> int:
        tries.append(1)
        if len(tries) == 1:
            raise closed  # what the first try met
        stop.set()  # the second one is stopped at once, as by SIGTERM
        return 0

    # The module (``flowledger.projections.follow`` names the function, which shadows it)
    monkeypatch.setattr(sys.modules["flowledger.projections.follow"], "follow", follow_losing_the_database)
    result = run(database_url, pg_schema, "projections", "follow")

    assert result.returncode == 0, result.stderr
    lost = [line for line in result.stdout.splitlines() if "lost the database" in line]
    assert lost == [
        "lost the database (OperationalError: consuming input failed: server closed the connection"
        " unexpectedly This probably means the server terminated abnormally before or while"
        " processing the request.); starting again in 0.5 s"
    ], result.stdout
