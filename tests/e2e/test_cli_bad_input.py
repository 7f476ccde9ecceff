"""Every ``flowledger`` command given bad input answers with one line on stderr and an exit
code, never a traceback: unknown names, bad values, files it cannot read or write, and a
database it cannot reach."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.cli import run_cli

# (arguments, exit code, part of the one line); "{dir}" is a directory, "{binary}" a file
# that is not text, both in the test's temporary directory, which is also the working one.
BAD_INPUT = [
    (["audit", "verify", "--file", "missing"], 74, "missing: No such file or directory"),
    (["audit", "verify", "--file", "{dir}"], 74, "Is a directory"),
    (["audit", "verify", "--file", "{binary}"], 65, "not UTF-8 text"),
    # Options for the database's log were ignored with a bundle, which passed as "ok"
    (
        ["audit", "verify", "--file", "missing", "--session", "x"],
        2,
        "file: a bundle is checked whole (with --public-key only): --session does not apply",
    ),
    (
        ["audit", "verify", "--file", "missing", "--since-checkpoint", "--anchors", "a.jsonl"],
        2,
        "(with --public-key only): --since-checkpoint, --anchors do not apply",
    ),
    (["audit", "export", "--out", "/no/such/dir/x"], 74, "/no/such/dir/x: No such file or directory"),
    (["audit", "export", "--session", "nobody"], 3, "session 'nobody' not found"),
    (["projections", "rebuild", "bogus"], 2, "unknown projection(s) ['bogus']; known:"),
    (["projections", "verify", "bogus"], 2, "unknown projection(s) ['bogus']; known:"),
    (["projections", "follow", "bogus"], 2, "unknown projection(s) ['bogus']; known:"),
    # An empty name is not "every projection" (an unset shell variable must not rebuild all)
    (["projections", "rebuild", ""], 2, "name: must be a non-empty string"),
    (["projections", "verify", " "], 2, "name: must be a non-empty string"),
    (["projections", "follow", ""], 2, "name: must be a non-empty string"),
    (["funnel", ""], 2, "workflow: must be a non-empty string"),
    (["funnel", "w\x01"], 2, "workflow:"),
    (["funnel", "w" * 201], 2, "workflow:"),
    (["funnel", "wf", "--by", "bogus"], 2, "by: breakdown must be 'model' or 'metadata.<key>'"),
    (["funnel", "wf", "--steps", "a,nosuch"], 2, "steps: unknown in workflow 'wf': a, nosuch"),
    (["funnel", "wf", "--steps", ",,,"], 2, "steps: a step name is empty in ',,,'"),
    (["funnel", "wf", "--steps", "a,,b"], 2, "steps: a step name is empty in 'a,,b'"),
    (["funnel", "wf", "--since", "yesterday"], 2, "since: 'yesterday' is not a duration"),
    (["dashboard", "--by", "bogus"], 2, "by: cannot group by ['bogus']"),
    (["dashboard", "--since", "x"], 2, "since: 'x' is not a duration"),
    (["dashboard", "--reprice-as", "nosuch"], 2, "reprice_as: no price for 'nosuch'"),
    (["history", "nobody"], 3, "session 'nobody' not found"),
    (["replay", "x", "--as-of", "yesterday"], 2, "as_of: 'yesterday' is not an RFC 3339 time"),
    (["replay", "x", "--version", "0"], 2, "version: must be a version >= 1, got 0"),
    # A negative number argument was taken for an option: "No such option: -1"
    (["fork", "x", "-1", "y"], 2, "at_version: must be a version >= 1, got -1"),
    (["keys", "create", "--tenant", "t", "--role", "bogus"], 2, "role: 'bogus' is not one of"),
    # An empty id (an unset shell variable) was "no active key ''", exit 3
    (["keys", "revoke", ""], 2, "key_id: must be a non-empty string"),
    (["keys", "revoke", " "], 2, "key_id: must be a non-empty string"),
    # An id PostgreSQL text cannot hold names no stored key (a lone surrogate, as a byte that is
    # not UTF-8 in argv reads, was exit 70 "unexpected UnicodeEncodeError"; a NUL exit 1)
    (["keys", "revoke", "\udcff"], 3, "no active key '\\udcff'"),
    (["keys", "revoke", "k\x00"], 3, "no active key 'k\\x00'"),
    (["keys", "create", "--tenant", "t", "--role", "admin", "--label", "a\nb"], 2, "label: must not contain"),
    (
        ["keys", "create", "--tenant", "t", "--role", "admin", "--label", "x" * 201],
        2,
        "label: must be at most 200",
    ),
    # A value too long to be a file's name is not a key either, and the line does not echo it whole
    (
        ["audit", "verify", "--public-key", "a" * 300],
        2,
        "public_key: '" + "a" * 77 + "'... is not an Ed25519",
    ),
    (
        ["audit", "verify", "--public-key", "{binary}"],
        2,
        "is a file that is not text, not an Ed25519 public key",
    ),
    (["serve", "--port", "99999"], 2, "port: must be a whole number from 0 to 65535"),
    (["simulate-llm", "--port", "99999"], 2, "port: must be a whole number from 0 to 65535"),
    (["simulate-llm", "--hang", "-1"], 2, "hang_s: must be a number from 0 to 3,600, got -1.0"),
    # A host it cannot listen on was blamed on the port ("port: cannot listen on ...")
    (
        ["simulate-llm", "--host", "nosuch.invalid", "--port", "0"],
        2,
        "host: cannot listen on nosuch.invalid:0",
    ),
    (["simulate-llm", "--host", "192.0.2.1", "--port", "0"], 2, "host: cannot listen on 192.0.2.1:0"),
    (["demo", "--sessions", "0"], 2, "sessions: must be a whole number from 1"),
    (["extend", "x", "--hours", "0"], 2, "hours: must be a positive number of hours, got 0"),
    (["extend", "x", "--hours", "-2"], 2, "hours: must be a positive number of hours, got -2"),
    (["extend", "x", "--hours", "nan"], 2, "hours: must be a positive number of hours, got nan"),
    (["extend", "x", "--hours", "1e-9"], 2, "hours: must be at least 1 ms (2.78e-07 hours), got 1e-09"),
    # How much can still be added is the session's to say: an unknown one is not found
    (["extend", "x", "--hours", "8785"], 3, "session 'x' not found"),
    (
        ["extend", "x", "--hours", "1e300"],
        2,
        "hours: 1e+300 hours reach past any expiry (at most 8784 ahead)",
    ),
    (["extend", "x", "--until", "soon"], 2, "until: 'soon' is not an RFC 3339 time"),
    # A time as REST reads one: digits are no time (seconds or milliseconds would be a guess),
    # no zone and before year 1 in UTC in the domain's words (the CLI said "needs a time zone")
    (
        ["replay", "x", "--as-of", "1796425540000"],
        2,
        "as_of: '1796425540000' is a number, not a time: give one with a zone, like 2026-12-05T10:00:00Z",
    ),
    (["extend", "x", "--until", "20261205"], 2, "until: '20261205' is a number, not a time"),
    (
        ["extend", "x", "--until", "2030-01-01T10:00:00"],
        2,
        "until: must carry a time zone (like +00:00 or Z), got 2030-01-01T10:00:00",
    ),
    (
        ["replay", "x", "--as-of", "0001-01-01T00:00:00+14:00"],
        2,
        "as_of: must lie in year 1 or later in UTC, got 0001-01-01T00:00:00+14:00",
    ),
    (["extend", "x"], 2, "expires_at: give a duration to add or a moment to set (one of them, not both)"),
    (["extend", "nobody", "--hours", "1"], 3, "session 'nobody' not found"),
]

NO_DATABASE = [
    ["history", "x"],
    ["replay", "x"],
    ["audit", "verify"],
    ["audit", "export"],
    ["projections", "status"],
    ["projections", "rebuild"],
    ["projections", "tenant-views", "t"],
    ["dashboard"],
    ["funnel", "wf"],
    ["migrate"],
    ["keys", "list"],
    ["extend", "x", "--hours", "1"],
]


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert message in lines[0]
    assert result.returncode == code, (result.returncode, lines)


@pytest.mark.parametrize(("args", "code", "message"), BAD_INPUT, ids=[" ".join(a) for a, _, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_an_exit_code(
    database_url: str, pg_schema: str, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "binary").write_bytes(b'{"a": "\xd0\x00\xff"}\n')
    (tmp_path / "dir").mkdir()
    filled = [a.format(dir=tmp_path / "dir", binary=tmp_path / "binary") for a in args]
    result = run_cli(database_url, pg_schema, *filled, cwd=tmp_path)
    assert_one_line(result, code, message)


def test_a_metadata_key_that_looks_like_a_placeholder_is_just_a_key(
    database_url: str, pg_schema: str
) -> None:
    # It once reached psycopg as a "%s" placeholder and ended in a ProgrammingError traceback.
    result = run_cli(database_url, pg_schema, "funnel", "wf", "--by", "metadata.%s")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "no sessions of workflow 'wf'" in result.stdout


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_unreachable(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> subprocess.CompletedProcess[str]:
    """``args`` run against a closed port on loopback, with a 2 s operation deadline."""
    monkeypatch.setenv("FLOWLEDGER_OPERATION_DEADLINE_S", "2")
    unreachable = f"postgresql://postgres@127.0.0.1:{_closed_port()}/nothing"
    return run_cli(unreachable, "unreachable", *args, cwd=tmp_path)


@pytest.mark.parametrize("args", NO_DATABASE, ids=[" ".join(a) for a in NO_DATABASE])
def test_an_unreachable_database_is_one_line_and_exit_75(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 2 s deadline rather than the default 15 s: the refusal is the same, only sooner
    # (how the deadline behaves is tests/integration/test_pg_outages.py's part).
    result = run_unreachable(args, tmp_path, monkeypatch)
    assert_one_line(result, 75, "the event store is unavailable")


def test_an_unreachable_database_says_how_long_it_was_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wrong port looked like a hang: the line said "Connection refused" after the whole
    # deadline without saying that it had been tried again for that long
    result = run_unreachable(["history", "s-1"], tmp_path, monkeypatch)
    assert_one_line(result, 75, "the event store is unavailable")
    assert re.search(r"Connection refused \(tried for [12]\.\d s\)", result.stderr), result.stderr


def test_a_server_that_never_answers_gives_75_within_the_operation_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a listener that takes connections and never answers, and a connect timeout (30 s)
    # longer than the operation deadline (3 s)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        monkeypatch.setenv("FLOWLEDGER_OPERATION_DEADLINE_S", "3")
        monkeypatch.setenv("FLOWLEDGER_CONNECT_TIMEOUT_S", "30")
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/nothing"
        # When a command needs the database
        started = time.monotonic()
        result = run_cli(url, "silent", "history", "x", cwd=tmp_path)
        took = time.monotonic() - started
    # Then it gives up as unavailable within a few seconds of the deadline, not the timeout
    assert_one_line(result, 75, "the event store is unavailable")
    assert took < 12, took


def _with_database(url: str, name: str, user: str | None = None) -> str:
    """``url`` with its database (and user) replaced."""
    parts = urlsplit(url)
    netloc = parts.netloc if user is None else f"{user}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{name}"))


@pytest.mark.parametrize(
    ("database", "user", "message"),
    [
        ("no_such_db_f1", None, 'database "no_such_db_f1" does not exist'),
        (None, "no_such_role_f1", 'role "no_such_role_f1" does not exist'),
    ],
)
def test_a_database_that_refuses_the_login_is_exit_1_at_once(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    database: str | None,
    user: str | None,
    message: str,
) -> None:
    # Given a server that answers, but has no such database or role: waiting will not help
    monkeypatch.setenv("FLOWLEDGER_OPERATION_DEADLINE_S", "20")
    url = _with_database(database_url, database or urlsplit(database_url).path.lstrip("/"), user)
    started = time.monotonic()
    result = run_cli(url, "refused", "history", "x", cwd=tmp_path)
    took = time.monotonic() - started
    # Then it says so in one line, exit 1 (not 75, "try again later"), without waiting out the deadline
    assert_one_line(result, 1, "the database refused the connection (migrate)")
    assert message in result.stderr
    assert "FLOWLEDGER_DATABASE_URL" in result.stderr
    assert took < 10, took


@pytest.mark.parametrize("args", [["keys", "list"], ["keys", "revoke", "k"], ["budgets", "list"]])
def test_a_store_with_a_pool_of_its_own_names_why_it_could_not_connect(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API keys' pool once said only "couldn't get a connection after 5.00 sec"
    result = run_unreachable(args, tmp_path, monkeypatch)
    assert_one_line(result, 75, "the event store is unavailable")
    assert "Connection refused" in result.stderr
