"""JSON the user gives the CLI (``--resolution``, a price, routing, anchor or bundle file) nested
deeper than Python's reader follows, or holding a number too long to read, is refused as input
(exit 2 for an argument or a setting, 65 for a file's data) with one line saying so: it ended as
"unexpected RecursionError (a bug in flowledger)", exit 70, and a long number's refusal repeated
Python's advice to raise ``sys.set_int_max_str_digits()``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowledger.verify import verify_bundle
from tests.e2e.test_cli_file_refusals import the_one_line
from tests.support.cli import run_cli

DEEP = "[" * 100_000 + "]" * 100_000
LONG_NUMBER = "1" + "0" * 5_000


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's FLOWLEDGER_HOME in the test's own directory, not the developer's."""
    monkeypatch.setenv("FLOWLEDGER_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("text", [DEEP, LONG_NUMBER], ids=["deep", "long number"])
def test_a_resolution_too_deep_or_too_long_to_read_is_refused_as_input(
    database_url: str, pg_schema: str, text: str
) -> None:
    # Given a task
    assert run_cli(database_url, pg_schema, "tasks", "create", "t-1", "--description", "d").returncode == 0
    # When it is completed with a resolution no reader takes
    done = run_cli(database_url, pg_schema, "tasks", "complete", "t-1", "--resolution", text)
    # Then the resolution is refused, in words for whoever wrote it, and the task stays open
    line = the_one_line(done, 2)
    assert line.startswith("error: resolution: ")
    assert "nested too deeply" in line or "more than 4,300 digits" in line
    assert "set_int_max_str_digits" not in line
    shown = run_cli(database_url, pg_schema, "tasks", "show", "t-1")
    assert "completed" not in shown.stdout


@pytest.mark.parametrize("text", [DEEP, LONG_NUMBER], ids=["deep", "long number"])
def test_a_file_too_deep_or_too_long_to_read_is_refused_naming_it(
    database_url: str, pg_schema: str, tmp_path: Path, text: str
) -> None:
    # Given a file whose one line no JSON reader takes
    bad = tmp_path / "bad.json"
    bad.write_text(text + "\n")
    # When it is named as prices, as anchors, as a bundle to restore
    prices = run_cli(database_url, pg_schema, "prices", "show", "--file", str(bad))
    anchors = run_cli(database_url, pg_schema, "audit", "verify", "--anchors", str(bad))
    bundle = run_cli(database_url, pg_schema, "retention", "restore", str(bad))
    # Then each is refused in one line that says why, not as a bug
    for done, code in ((prices, 2), (anchors, 65), (bundle, 65)):
        line = the_one_line(done, code)
        assert "nested too deeply" in line or "more than 4,300 digits" in line, line
        assert "set_int_max_str_digits" not in line


def test_the_offline_verifier_reports_a_line_too_deep_to_read() -> None:
    # (It read the line with json.loads and caught only ValueError: RecursionError escaped.)
    report = verify_bundle([DEEP], bytes(32))
    assert report.problems
    assert "line 1: not a bundle record" in report.problems[0]
