"""A mistyped command line is refused as every other refusal is: one ``error:`` line on stderr
naming what is wrong and where to read more, exit 2, and no click usage block or framed
panel. Help still prints, to stdout."""

from __future__ import annotations

import pytest

from flowledger.adapters.cli.main import main
from tests.support.cli import run_cli_process


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out, err = capsys.readouterr()
    assert isinstance(ended.value.code, int)
    return ended.value.code, out, err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["nosuch"], "error: No such command 'nosuch'. (see 'flowledger --help')"),
        (["history"], "error: Missing argument 'session_id'. (see 'flowledger history --help')"),
        (["history", "s1", "--nope"], "error: No such option: --nope (see 'flowledger history --help')"),
        (["serve", "--port", "x"], "error: Invalid value for '--port': Input should be a valid integer"),
        (["audit", "nosuch"], "error: No such command 'nosuch'. (see 'flowledger audit --help')"),
        # An enumerated value's refusal without pydantic's "Value error, " before it
        (
            ["budgets", "set", "nope", "x", "day", "5"],
            "error: Invalid value for 'scope': 'nope' is not one of 'tenant', 'user', 'session', 'workflow',"
            " 'model'. (see 'flowledger budgets set --help')",
        ),
        (["serve", "--loop", "nope"], "error: Invalid value for '--loop': 'nope' is not one of 'auto', "),
        (
            ["budgets", "set"],
            "error: Missing argument 'scope'. Choose from: tenant, user, session, workflow, model"
            " (see 'flowledger budgets set --help')",
        ),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(said), err
    assert "╭" not in err
    assert "Usage:" not in err


def test_help_and_a_bare_group_still_print_help_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--help")
    assert (code, err) == (0, "")
    assert "Usage: flowledger" in out
    assert "migrate" in out
    code, out, _ = run(capsys, "audit")
    assert code == 2
    assert "Usage: flowledger audit" in out
    assert "verify" in out


def test_the_installed_executable_runs_main(database_url: str, pg_schema: str) -> None:
    result = run_cli_process(database_url, pg_schema, "nosuch")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: No such command 'nosuch'. (see 'flowledger --help')"
