"""A row of the log changed in the database so that it no longer reads back (a byte of its
payload overwritten, a topic no event class has) is bad data, not a bug in flowledger: every
command that reads the stream says which row, in one line, exit 65 (EX_DATAERR)."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli
from tests.support.event_rows import chained_again

DAMAGE = {
    # The first payload byte: '{' becomes 0xff, which is not UTF-8 (nor JSON)
    "a payload byte overwritten": "UPDATE {events} SET state = set_byte(state, 0, 255)",
    "a topic no event class has": "UPDATE {events} SET topic = 'flowledger.domain.nosuch:Thing'",
    # JSON still, but a field's key renamed: it once surfaced as an AttributeError (exit 70)
    "a field renamed": (
        "UPDATE {events} SET state ="
        " convert_to(replace(convert_from(state, 'UTF8'), '\"step\"', '\"stap\"'), 'UTF8')"
    ),
    "an empty payload": "UPDATE {events} SET state = '{{}}'::bytea",
    # JSON still, but the step name holds an escaped lone surrogate: it read back as a str no
    # UTF-8 writer takes (history exited 0, HTTP reads were a 500 "internal error")
    "a lone surrogate escaped": (
        "UPDATE {events} SET state ="
        " convert_to(replace(convert_from(state, 'UTF8'),"
        " '\"greet\"', '\"gr' || chr(92) || 'ud800eet\"'), 'UTF8')"
    ),
    # These raised a bare TypeError, AttributeError or KeyError out of every reader (exit 70)
    "a NULL payload": "UPDATE {events} SET state = NULL",
    "a NULL topic": "UPDATE {events} SET topic = NULL",
    "a payload that is a JSON array": "UPDATE {events} SET state = convert_to('[1, 2]', 'UTF8')",
    "a payload that is a JSON number": "UPDATE {events} SET state = convert_to('5', 'UTF8')",
    "a topic naming a function": "UPDATE {events} SET topic = 'os:system'",
    "a topic naming a class that is no event": "UPDATE {events} SET topic = 'builtins:dict'",
    # JSON still, its stamp a string: record_step met a TypeError comparing stamps
    "a stamp that is no time": (
        "UPDATE {events} SET state = convert_to(jsonb_set(convert_from(state, 'UTF8')::jsonb,"
        " '{{timestamp}}', '\"yesterday\"')::text, 'UTF8')"
    ),
}

READERS = [
    ["history", "victim"],
    ["replay", "victim"],
    ["extend", "victim", "--hours", "1"],
    ["fork", "victim", "3", "victim-2"],
]
GAP_READERS = [*READERS, ["projections", "rebuild"]]
"""A rebuild reads every stream too: it once counted the session without the deleted step, exit 0."""


@pytest.fixture
def victim(database_url: str, pg_schema: str) -> Iterator[UUID]:
    """A session of three events, in its own schema."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("victim", "cs", user_id="u-1")
        engine.record_step("victim", "greet", input={"q": "hello"})  # version 2
        engine.record_step("victim", "answer", input={"q": "refund?"})  # version 3
        yield engine.session_uuid("victim")


def damage_version_2(database_url: str, schema: str, victim: UUID, damage: str) -> None:
    """Change version 2 of ``victim``'s stream in the database directly, as ``DAMAGE[damage]`` says."""
    statement = SQL(DAMAGE[damage] + " WHERE originator_id = %s AND originator_version = 2")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(statement.format(events=Identifier(schema, "flowledger_events")), (victim,))


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
@pytest.mark.parametrize("args", READERS, ids=[a[0] for a in READERS])
def test_a_row_that_no_longer_reads_is_named_in_one_line_exit_65(
    database_url: str, pg_schema: str, victim: UUID, damage: str, args: list[str]
) -> None:
    # Given version 2 of the session's stream changed in the database directly
    damage_version_2(database_url, pg_schema, victim, damage)
    # (chained again under the key: a read by an engine that chains refuses an unsealed edit first)
    chained_again(database_url, pg_schema, victim, make_settings())
    # When a command reads the stream
    result = run_cli(database_url, pg_schema, *args)
    # Then it names the row and what to run, in one line, as bad data (not "a bug in flowledger")
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: a stored event does not read back: "), lines
    assert f"stream {victim} version 2" in lines[0]
    assert "flowledger audit verify" in lines[0]
    assert "a bug in flowledger" not in lines[0]
    assert result.returncode == 65, (result.returncode, lines)


def test_a_rebuild_that_sets_a_row_aside_names_it_and_exits_1(
    database_url: str, pg_schema: str, victim: UUID
) -> None:
    # Given version 2 of the session's stream overwritten in the database directly
    damage_version_2(database_url, pg_schema, victim, "a payload byte overwritten")
    # When the projections are rebuilt from the log
    result = run_cli(database_url, pg_schema, "projections", "rebuild")
    # Then the builds still go live (a dead letter never wedges them), but the rebuild does not
    # pass for a clean one: each set-aside row is named and the exit status is 1
    assert "Traceback" not in result.stderr
    assert "rebuilt current_state" in result.stdout
    lines = result.stderr.strip().splitlines()
    letters = [line for line in lines if line.startswith("dead letter: ")]
    assert letters, result.stderr
    assert all(f"stream {victim} version 2" in line for line in letters), letters
    assert lines[-1].startswith("error: the new builds set aside "), lines
    assert "flowledger projections status" in lines[-1]
    assert result.returncode == 1, (result.returncode, lines)


def test_a_rebuild_sets_aside_a_row_edited_so_that_it_still_reads_and_exits_1(
    database_url: str, pg_schema: str, victim: UUID
) -> None:
    # Given the input of version 2 changed in the database: it still reads back, but its stored
    # hash no longer fits (audit verify names it altered)
    statement = SQL(
        "UPDATE {} SET state = convert_to(replace(convert_from(state, 'UTF8'), 'hello', 'HELLO'), 'UTF8')"
        " WHERE originator_id = %s AND originator_version = 2"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute(statement.format(Identifier(pg_schema, "flowledger_events")), (victim,)).rowcount
    # When the projections are rebuilt, Then the row is set aside as altered, named, exit 1
    # (the rebuild had applied it, exit 0, with no word)
    result = run_cli(database_url, pg_schema, "projections", "rebuild")
    lines = result.stderr.strip().splitlines()
    letters = [line for line in lines if line.startswith("dead letter: ")]
    assert letters, result.stderr
    assert all(f"stream {victim} version 2" in line and "altered" in line for line in letters), letters
    assert lines[-1].startswith("error: the new builds set aside "), lines
    assert result.returncode == 1, (result.returncode, lines)
    # One event was edited: the count is of events, not of the builds' letters (it said 4 events)
    said = f"error: the new builds set aside 1 event as {len(letters)} dead letters"
    assert lines[-1].startswith(said), lines
    # ... and verify, finding both sides set it aside, counts it so too
    verified = run_cli(database_url, pg_schema, "projections", "verify")
    assert verified.returncode == 0, verified.stderr
    same = f"both set aside the same 1 event as {len(letters)} dead letters"
    assert same in verified.stdout, verified.stdout


def test_a_clean_rebuild_says_nothing_on_stderr_and_exits_0(
    database_url: str, pg_schema: str, victim: UUID
) -> None:
    result = run_cli(database_url, pg_schema, "projections", "rebuild")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "rebuilt cost" in result.stdout


def test_audit_verify_of_the_damaged_session_reports_the_row_instead_of_stopping_on_it(
    database_url: str, pg_schema: str, victim: UUID
) -> None:
    # Given version 2 overwritten so that it no longer reads back
    damage_version_2(database_url, pg_schema, victim, "a payload byte overwritten")
    # When that one session's stream is verified
    result = run_cli(database_url, pg_schema, "audit", "verify", "--session", "victim")
    # Then the check runs (its existence check once read every event) and names the row
    assert result.returncode == 1, result.stderr
    assert f"problem: altered: stream {victim} (victim) version 2" in result.stderr


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
@pytest.mark.parametrize("scope", [[], ["--session", "victim"]], ids=["the log", "one session"])
def test_audit_verify_reports_every_kind_of_damaged_row_as_a_finding(
    database_url: str, pg_schema: str, victim: UUID, damage: str, scope: list[str]
) -> None:
    # Given version 2 changed in the database (a NULL topic: AttributeError, exit 70, before)
    damage_version_2(database_url, pg_schema, victim, damage)
    # When the log, or the session, is verified, as every damaged-row error advises
    result = run_cli(database_url, pg_schema, "audit", "verify", *scope)
    # Then the row is a finding (exit 1), not a bug in flowledger
    assert "Traceback" not in result.stderr
    assert "a bug in flowledger" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    assert "version 2" in result.stderr or " v2)" in result.stderr, result.stderr


def test_audit_verify_of_a_session_that_never_existed_is_still_not_found(
    database_url: str, pg_schema: str
) -> None:
    result = run_cli(database_url, pg_schema, "audit", "verify", "--session", "nobody")
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == "error: session 'nobody' not found"


@pytest.mark.parametrize("args", GAP_READERS, ids=[" ".join(a[:2]) for a in GAP_READERS])
def test_a_row_deleted_from_the_middle_of_a_stream_is_named_in_one_line_exit_65(
    database_url: str, pg_schema: str, victim: UUID, args: list[str]
) -> None:
    # Given version 2 deleted in the database directly: version 3 now follows version 1
    statement = SQL("DELETE FROM {events} WHERE originator_id = %s AND originator_version = 2")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(statement.format(events=Identifier(pg_schema, "flowledger_events")), (victim,))
    # When a command loads the session
    result = run_cli(database_url, pg_schema, *args)
    # Then it names the missing version (it was "unexpected OriginatorVersionError (a bug in
    # flowledger): (3, 2)", exit 70; history printed versions 1 and 3 as if nothing were missing)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: a stored event is missing: stream {victim} version 2"), lines
    assert "flowledger audit verify" in lines[0]
    assert result.returncode == 65, (result.returncode, lines)


@pytest.mark.parametrize("args", READERS, ids=[" ".join(a[:1]) for a in READERS])
def test_a_session_whose_first_row_was_deleted_is_named_in_one_line_exit_65(
    database_url: str, pg_schema: str, victim: UUID, args: list[str]
) -> None:
    # Given version 1 (the session's Started) deleted in the database directly
    statement = SQL("DELETE FROM {events} WHERE originator_id = %s AND originator_version = 1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(statement.format(events=Identifier(pg_schema, "flowledger_events")), (victim,))
    # When a command reads the session
    result = run_cli(database_url, pg_schema, *args)
    # Then it names version 1 as missing (replay and extend were "unexpected AssertionError (a
    # bug in flowledger)", exit 70; history printed versions 2 and 3 as if nothing were missing)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"error: a stored event is missing: stream {victim} version 1 (the next stored is 2)"
    ), lines
    assert result.returncode == 65, (result.returncode, lines)


def test_rows_swapped_in_the_log_stop_a_rebuild_in_one_line_exit_65(
    database_url: str, pg_schema: str, victim: UUID
) -> None:
    # Given versions 2 and 3 swapped in the log's order (their notification ids exchanged)
    events = Identifier(pg_schema, "flowledger_events")
    move = SQL("UPDATE {} SET notification_id = %s WHERE originator_id = %s AND originator_version = %s")
    with psycopg.connect(database_url, autocommit=True) as conn:
        held = dict(
            conn.execute(
                SQL(
                    "SELECT originator_version, notification_id FROM {} WHERE originator_id = %s"
                    " AND originator_version IN (2, 3)"
                ).format(events),
                (victim,),
            ).fetchall()
        )
        conn.execute(move.format(events), (-held[2], victim, 2))
        conn.execute(move.format(events), (held[2], victim, 3))
        conn.execute(move.format(events), (held[3], victim, 2))
    # When the projections are rebuilt, Then the stream and the versions are named (it was exit
    # 0, the answer applied before the greeting), as bad data
    result = run_cli(database_url, pg_schema, "projections", "rebuild")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"error: stored events are out of order: stream {victim} version 3 (log position {held[2]})"
        f" comes before version 2 (log position {held[3]})"
    ), lines
    assert "flowledger audit verify" in lines[0]
    assert result.returncode == 65, (result.returncode, lines)
