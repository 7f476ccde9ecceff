"""Files and tenants the user names on the command line are refused, never read past: a file
that cannot be read exits 74, one whose data is not what it should hold 65, a tenant that is
not a name 2; each with one ``error:`` line on stderr and nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.cli import run_cli


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's FLOWLEDGER_HOME in the test's own directory, not the developer's."""
    monkeypatch.setenv("FLOWLEDGER_HOME", str(tmp_path / "home"))


def the_one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single ``error:`` line of a refused command, once its exit code is checked."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert result.returncode == code, (result.returncode, lines)
    return lines[0]


def stored_rows(database_url: str, schema: str) -> int:
    """Rows in the schema's events and retention policy tables (0 when there are none)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s"
            " AND (tablename LIKE '%%\\_events' OR tablename = 'flowledger_retention_policies')",
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


def test_a_price_or_bundle_file_that_cannot_be_read_exits_74_and_one_not_text_65(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a missing path, a directory and a file that is not UTF-8 text
    missing = tmp_path / "nonexistent.json"
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.bin").write_bytes(b'{"a": "\xd0\x00\xff"}\n')
    reprice = ["prices", "reprice", "--from", "2026-01-01", "--file"]
    for command in (["prices", "show", "--file"], reprice, ["retention", "restore"]):
        # When each is named as the file
        gone = run_cli(database_url, pg_schema, *command, str(missing))
        directory = run_cli(database_url, pg_schema, *command, str(tmp_path / "adir"))
        binary = run_cli(database_url, pg_schema, *command, str(tmp_path / "binary.bin"))
        # Then the first two cannot be read (74), the third is not text (65), each said once
        line = the_one_line(gone, 74)
        assert f"{missing}: No such file or directory" in line
        assert line.count("No such file") == 1
        assert "Is a directory" in the_one_line(directory, 74)
        # naming the file
        line = the_one_line(binary, 65)
        assert line == f"error: {tmp_path / 'binary.bin'}: not UTF-8 text (invalid continuation byte)"


def test_a_bundle_to_restore_that_is_not_a_bundle_exits_65_naming_the_line(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a file of JSON that is no bundle, and a file that is not JSON
    (tmp_path / "notbundle.jsonl").write_text('{"not": "a bundle"}\n')
    (tmp_path / "garbage.jsonl").write_text("\n{not json\n")
    # When each is restored
    not_bundle = run_cli(database_url, pg_schema, "retention", "restore", str(tmp_path / "notbundle.jsonl"))
    garbage = run_cli(database_url, pg_schema, "retention", "restore", str(tmp_path / "garbage.jsonl"))
    # Then both are malformed data (65), with the line that is wrong
    assert "bundle: line 1: not a bundle" in the_one_line(not_bundle, 65)
    assert "bundle: line 2: not JSON" in the_one_line(garbage, 65)


def test_an_anchor_file_that_does_not_exist_is_refused_not_ignored(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given an anchor file that is not there
    missing = tmp_path / "nonexistent.jsonl"
    # When the log is verified against it
    result = run_cli(database_url, pg_schema, "audit", "verify", "--anchors", str(missing))
    # Then it cannot be read (74), rather than verifying as if no anchor were given
    assert f"{missing}: No such file or directory" in the_one_line(result, 74)
    assert "ok" not in result.stdout + result.stderr


def test_an_anchor_line_that_is_not_a_checkpoint_record_is_malformed_data_not_tampering(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given an anchor file of JSON that is no checkpoint record, and one whose second line is not JSON
    (tmp_path / "notbundle.jsonl").write_text('{"not": "a bundle"}\n')
    exported = tmp_path / "exported.jsonl"
    assert run_cli(database_url, pg_schema, "audit", "checkpoint").returncode == 0
    assert run_cli(database_url, pg_schema, "audit", "checkpoints", "--out", str(exported)).returncode == 0
    (tmp_path / "cut.jsonl").write_text(exported.read_text() + '{"type": "checkpoint", "statem\n')
    # When the log is verified against each, and against the real export
    stray = run_cli(
        database_url, pg_schema, "audit", "verify", "--anchors", str(tmp_path / "notbundle.jsonl")
    )
    cut = run_cli(database_url, pg_schema, "audit", "verify", "--anchors", str(tmp_path / "cut.jsonl"))
    real = run_cli(database_url, pg_schema, "audit", "verify", "--anchors", str(exported))
    # Then the first two are malformed data (65) naming the line, not a dropped checkpoint
    line = the_one_line(stray, 65)
    assert "anchors: line 1: not a checkpoint record" in line
    assert "dropped" not in stray.stdout + stray.stderr
    assert "anchors: line 2: not JSON" in the_one_line(cut, 65)
    # And what `audit checkpoints` wrote still verifies
    assert real.returncode == 0, real.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["retention", "set", "--workflow", "cs", "--days", "5"],
        ["retention", "list"],
        ["retention", "remove", "--workflow", "cs"],
        ["retention", "run", "--dry-run"],
        ["retention", "restore", "bundle.jsonl"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_tenant_with_a_control_character_is_refused_and_nothing_is_stored(
    database_url: str, pg_schema: str, tmp_path: Path, args: list[str]
) -> None:
    # Given a tenant name holding U+0001 (and a file for restore to name)
    (tmp_path / "bundle.jsonl").write_text('{"type": "header", "format": 1}\n')
    # When a retention command is given it
    result = run_cli(database_url, pg_schema, *args, "--tenant", "t\x01", cwd=tmp_path)
    # Then it is refused as a bad name (2), and no policy or event was stored
    line = the_one_line(result, 2)
    assert "tenant: must not contain control characters" in line
    assert "\x01" not in result.stdout + result.stderr
    assert stored_rows(database_url, pg_schema) == 0


@pytest.mark.parametrize(
    ("command", "code", "said"),
    [
        (["prices", "show", "--file"], 2, "pricing_file: zero is larger than 16,777,216 bytes"),
        (["audit", "verify", "--file"], 65, "bundle: line 1: longer than 67,108,864 characters"),
        (["audit", "verify", "--anchors"], 65, "anchors: line 1: longer than 67,108,864 characters"),
        (["retention", "restore"], 65, "bundle: line 1: longer than 67,108,864 characters"),
    ],
)
def test_a_file_that_never_ends_is_refused_after_a_bound_not_read_until_memory_runs_out(
    database_url: str, pg_schema: str, command: list[str], code: int, said: str
) -> None:
    # /dev/zero never ends a line nor the file: each reader stops at its bound and says so
    result = run_cli(database_url, pg_schema, *command, "/dev/zero")
    assert the_one_line(result, code) == f"error: {said}"
