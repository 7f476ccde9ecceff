"""The ``flowledger`` executable: history, replay and error exit codes, on real PostgreSQL."""

from __future__ import annotations

import subprocess
from datetime import UTC, timedelta
from decimal import Decimal
from pathlib import Path

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.database import drop_schema
from tests.conftest import make_settings
from tests.support.cli import run_cli


def run(database_url: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(database_url, schema, *args)


def test_history_and_replay_show_a_session_as_it_was(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("cli-1", "customer_service")
        engine.record_step("cli-1", "greet", next_step="classify", context_update={"lang": "en"})
        engine.record_step("cli-1", "classify", context_update={"intent": "refund"})

    history = run(database_url, pg_schema, "history", "cli-1")
    assert history.returncode == 0, history.stderr
    assert "Session.Started" in history.stdout
    assert history.stdout.count("Session.StepProcessed") == 2

    replay = run(database_url, pg_schema, "replay", "cli-1", "--version", "2")
    assert replay.returncode == 0, replay.stderr
    assert "classify" in replay.stdout  # current step at version 2
    assert "refund" not in replay.stdout


def test_history_prints_each_events_data_as_json_not_python_reprs(database_url: str, pg_schema: str) -> None:
    # (It printed a step's usage as "LlmUsage(provider='openai', ...)" and times as
    # "2026-12-07 22:37:38.981702+00:00", where GET /v1/sessions/{id}/history answers JSON.)
    # Given a session with a step that carries its usage
    usage = LlmUsage(
        provider="openai",
        request_model="gpt-4.1",
        input_tokens=812,
        output_tokens=64,
        cost_usd=Decimal("0.002136"),
    )
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        started = engine.start_session("cli-h", "cs")
        engine.record_step("cli-h", "g", usage=usage)

    # When its history is printed
    history = run_cli(database_url, pg_schema, "history", "cli-h", columns=400)

    # Then the data column is JSON, as REST's history answers it
    assert history.returncode == 0, history.stderr
    assert '"usage":{"provider":"openai"' in history.stdout
    assert "LlmUsage(" not in history.stdout
    assert f'"expires_at":"{started.expires_at.isoformat()[:19]}' in history.stdout


def test_extend_adds_hours_to_the_expiry_or_sets_it_and_says_so(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        started = engine.start_session("cli-2", "customer_service", ttl=timedelta(hours=24))
    later = started.expires_at + timedelta(hours=2)

    added = run(database_url, pg_schema, "extend", "cli-2", "--hours", "2")
    assert added.returncode == 0, added.stderr
    assert f"now expires at {later.isoformat(timespec='seconds')}" in added.stdout
    assert f"it was {started.expires_at.isoformat(timespec='seconds')}" in added.stdout

    moment = (started.expires_at - timedelta(hours=12)).replace(microsecond=0)
    assert run(database_url, pg_schema, "extend", "cli-2", "--until", moment.isoformat()).returncode == 0
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.get_session("cli-2").expires_at == moment


def test_extend_run_again_with_its_idempotency_key_moves_the_expiry_once(
    database_url: str, pg_schema: str
) -> None:
    # Given a session that expires in 24 h
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        started = engine.start_session("cli-3", "customer_service", ttl=timedelta(hours=24))
    later = (started.expires_at + timedelta(hours=2)).isoformat(timespec="seconds")
    was = started.expires_at.isoformat(timespec="seconds")

    # When `extend --hours 2` runs twice under one key (a cron job's retry after a timeout)
    first = run(database_url, pg_schema, "extend", "cli-3", "--hours", "2", "--idempotency-key", "nightly-1")
    again = run(database_url, pg_schema, "extend", "cli-3", "--hours", "2", "--idempotency-key", "nightly-1")

    # Then the expiry moved once, and the retry prints the first run's answer
    assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
    assert first.stdout == again.stdout
    assert f"now expires at {later} (it was {was})" in again.stdout
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.get_session("cli-3").expires_at == started.expires_at + timedelta(hours=2)
        assert engine.get_session("cli-3").version == 2

    # And the same key with other hours is refused in one line, nothing moved
    other = run(database_url, pg_schema, "extend", "cli-3", "--hours", "3", "--idempotency-key", "nightly-1")
    assert other.returncode != 0
    assert len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "nightly-1" in other.stderr


def test_an_unknown_session_exits_3_with_one_line(database_url: str, pg_schema: str) -> None:
    result = run(database_url, pg_schema, "history", "nobody")
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == ["error: session 'nobody' not found"]


def test_a_bad_time_exits_2_with_one_line(database_url: str, pg_schema: str) -> None:
    result = run(database_url, pg_schema, "replay", "x", "--as-of", "yesterday")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "as_of" in result.stderr


def test_audit_verifies_the_log_and_an_exported_session(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("audited", "cs")
        engine.record_step("audited", "greet")

    verified = run(database_url, pg_schema, "audit", "verify")
    assert verified.returncode == 0, verified.stderr
    assert "2 events in 1 streams: no problems found, but not proven" in verified.stderr

    export = tmp_path / "audited.jsonl"
    exported = run(database_url, pg_schema, "audit", "export", "--session", "audited", "--out", str(export))
    assert exported.returncode == 0, exported.stderr
    assert len(export.read_text().splitlines()) == 5  # header, checkpoint, two events, the head
    assert run(database_url, pg_schema, "audit", "verify", "--file", str(export)).returncode == 0

    export.write_text(export.read_text().replace("greet", "forged"))
    tampered = run(database_url, pg_schema, "audit", "verify", "--file", str(export))
    assert tampered.returncode == 1
    assert "version 2: the event does not match its hash (an altered row)" in tampered.stderr


def test_every_error_class_has_an_exit_code_and_an_http_status() -> None:
    from flowledger.adapters.cli.errors import EXIT_CODES
    from flowledger.adapters.http.errors import STATUS_CODES
    from flowledger.domain import errors

    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.FlowledgerError)
    ]
    abstract = {
        errors.FlowledgerError,
        errors.SessionError,
        errors.TaskError,
        errors.AgentError,
        errors.LlmError,
        errors.BudgetError,  # a base: BudgetNotFound and BudgetExceeded are raised
        errors.LogDamaged,  # a base: StoredEventUnreadable and StoredEventMissing are raised
    }
    for kind in set(classes) - abstract:
        assert any(kind is k for k, _ in EXIT_CODES), f"{kind.__name__} has no exit code of its own"
        assert any(kind is k for k, _ in STATUS_CODES), f"{kind.__name__} has no HTTP status of its own"


def test_dashboard_and_funnel_print_what_the_projections_hold(database_url: str, pg_schema: str) -> None:
    from decimal import Decimal

    from flowledger.domain import LlmUsage

    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        for n in range(3):
            engine.start_session(f"f-{n}", "checkout")
            engine.record_step(
                f"f-{n}",
                "cart",
                next_step="pay",
                usage=LlmUsage(
                    request_model="gpt-4.1", input_tokens=1000, output_tokens=100, cost_usd=Decimal("0.0028")
                ),
            )
        engine.record_step("f-0", "pay")

    dashboard = run(database_url, pg_schema, "dashboard", "--since", "1h")
    assert dashboard.returncode == 0, dashboard.stderr
    assert "gpt-4.1" in dashboard.stdout
    assert "0.0084" in dashboard.stdout  # three calls at $0.0028
    funnel = run(database_url, pg_schema, "funnel", "checkout")
    assert funnel.returncode == 0, funnel.stderr
    assert "3 sessions" in funnel.stdout
    assert "cart" in funnel.stdout
    assert "pay" in funnel.stdout
    # a month reads the roll-ups, and --exact the raw rows: the same calls and cost either way
    for exact in ((), ("--exact",)):
        month = run(database_url, pg_schema, "dashboard", "--since", "30d", *exact)
        assert month.returncode == 0, month.stderr
        assert "0.0084" in month.stdout
        funnel_month = run(database_url, pg_schema, "funnel", "checkout", "--since", "30d", *exact)
        assert funnel_month.returncode == 0, funnel_month.stderr
        assert "3 sessions" in funnel_month.stdout
    bad = run(database_url, pg_schema, "dashboard", "--by", "colour")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1


def test_migrate_prepares_a_schema_once_and_says_so(database_url: str, pg_schema: str) -> None:
    # Given a schema no engine has touched (the fixture made none)
    first = run(database_url, f"{pg_schema}_m", "migrate")
    again = run(database_url, f"{pg_schema}_m", "migrate")
    assert first.returncode == 0, first.stderr
    assert "created or upgraded" in first.stdout
    assert again.returncode == 0, again.stderr
    assert "already current" in again.stdout
    try:
        with Engine(settings=make_settings(database_url=database_url, schema=f"{pg_schema}_m")) as engine:
            engine.start_session("after-migrate", "cs")
    finally:
        drop_schema(database_url, f"{pg_schema}_m")


def test_an_unreachable_database_is_one_line_and_exit_code_75(pg_schema: str) -> None:
    # A short deadline: the default (15 s) is what the test would otherwise wait for.
    deadline = {"FLOWLEDGER_OPERATION_DEADLINE_S": "2"}
    result = run_cli("postgresql://nobody@127.0.0.1:1/test", pg_schema, "history", "anything", env=deadline)
    assert result.returncode == 75
    assert result.stderr.strip().startswith("error: the event store is unavailable")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_replay_writes_a_tiny_cost_as_a_plain_decimal(database_url: str, pg_schema: str) -> None:
    from decimal import Decimal

    from flowledger.domain import LlmUsage

    # Given a step that cost a ten-millionth of a dollar
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("tiny", "checkout")
        engine.record_step(
            "tiny", "cart", usage=LlmUsage(request_model="gpt-4.1", cost_usd=Decimal("0.0000001"))
        )
    # When the session is replayed, Then its cost reads $0.0000001 (it read $1E-7)
    replay = run(database_url, pg_schema, "replay", "tiny")
    assert replay.returncode == 0, replay.stderr
    assert "$0.0000001" in replay.stdout
    assert "E-7" not in replay.stdout


def test_expire_sessions_records_the_expiries_that_passed(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("gone", "wf", ttl=timedelta(milliseconds=1))
        engine.start_session("here", "wf", ttl=timedelta(hours=1))

    swept = run(database_url, pg_schema, "expire-sessions")
    again = run(database_url, pg_schema, "expire-sessions")
    bad = run(database_url, pg_schema, "expire-sessions", "--limit", "0")

    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "expired 1 of 1 overdue sessions (gone)"
    assert again.stdout.strip() == "expired 0 of 0 overdue sessions"
    assert bad.returncode == 2
    assert "limit: must be a whole number from 1 to 100000, got 0" in bad.stderr
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        states = (engine.get_session("gone"), engine.get_session("here"))
    assert [e.status for e in states] == ["expired", "active"]


def test_the_funnel_says_why_sessions_that_reached_no_step_stopped(database_url: str, pg_schema: str) -> None:
    # Given four sessions of one workflow: one at a step, three that reached none (one abandoned,
    # one completed, one still open)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        for n in range(4):
            engine.start_session(f"b-{n}", "checkout")
        engine.record_step("b-0", "cart")
        engine.abandon_session("b-1", "left")
        engine.complete_session("b-2", "nothing to do")
    # When the funnel is printed, Then its title counts four sessions and it says what became of
    # the three that reached no step (the table showed only the step's row: 1 reached, 25 %)
    funnel = run(database_url, pg_schema, "funnel", "checkout")
    assert funnel.returncode == 0, funnel.stderr
    assert "4 sessions" in funnel.stdout
    assert "3 of 4 sessions reached no step: abandoned 1, completed 1, in progress 1" in funnel.stdout


def test_a_moment_history_prints_replays_the_event_printed_at_it(database_url: str, pg_schema: str) -> None:
    # (An outside probe: history printed "2026-12-07 02:03:16.753", its stamp cut to the
    # millisecond and without a zone; given back to replay --as-of as 2026-12-07T02:03:16.753Z it
    # lay before the event's own stamp, 02:03:16.753708, and replayed the version before it.)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("cli-at", "customer_service")
        engine.record_step("cli-at", "greet", next_step="classify", context_update={"lang": "en"})
        stamp = engine.history("cli-at")[1].timestamp
    # When the moment history prints for version 2 is given to replay as it is printed
    history = run_cli(database_url, pg_schema, "history", "cli-at", columns=200)
    assert history.returncode == 0, history.stderr
    (row,) = [line for line in history.stdout.splitlines() if "Session.StepProcessed" in line]
    printed = next(word for word in row.split() if word[:4].isdigit() and "T" in word)
    replay = run_cli(database_url, pg_schema, "replay", "cli-at", "--as-of", printed)
    # Then it is the event's exact stamp, and the replay is at version 2
    assert printed == stamp.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert replay.returncode == 0, replay.stderr
    assert "at version 2" in replay.stdout
