"""An option that takes one value, given twice, is refused as any other usage error (one
``error:`` line, exit 2), on every command: click kept the last one silently. Options meant
to repeat still take every value."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer

# typer vendors click: its commands, options and errors are these, not the click package's.
from typer._click.core import Command
from typer._click.exceptions import UsageError
from typer.core import TyperGroup, TyperOption

from flowledger.adapters.cli.main import app, main
from tests.support.cli import run_cli


def _commands(command: Command, path: str) -> Iterator[tuple[str, Command]]:
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, f"{path} {name}")
    else:
        yield path, command


def _single_valued_options() -> Iterator[tuple[str, Command, TyperOption]]:
    for path, command in _commands(typer.main.get_command(app), "flowledger"):
        for param in command.params:
            if isinstance(param, TyperOption) and not (param.multiple or param.count or param.is_eager):
                yield path, command, param


def test_every_command_refuses_each_of_its_single_valued_options_given_twice() -> None:
    checked = 0
    for path, command, option in _single_valued_options():
        # Given the option twice, the second time by another of its names where it has one
        name, other = option.opts[0], (option.opts + option.secondary_opts)[-1]
        words = [name, other] if option.is_flag else [name, "1", other, "2"]
        # When the line is parsed (before any argument is checked: none is given)
        with pytest.raises(UsageError) as refused:
            command.make_context(path, words)
        # Then it is refused naming the option
        assert "is given 2 times; it takes one value" in refused.value.format_message(), (path, name)
        assert f"'{name}'" in refused.value.format_message()
        checked += 1
    assert checked > 100  # every command's options, not a few


def test_a_repeated_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (
        ["dashboard", "--since", "1h", "--since", "2h"],
        ["dashboard", "--since=1h", "--since=2h"],
        ["fork", "s-1", "1", "s-2", "--ttl-hours", "1", "--ttl-hours", "-2"],  # NumberArguments
    ):
        with pytest.raises(SystemExit) as ended:
            main(args)
        out, err = capsys.readouterr()
        assert ended.value.code == 2
        assert out == ""
        option = "--since" if args[0] == "dashboard" else "--ttl-hours"
        said = f"error: Option '{option}' is given 2 times; it takes one value"
        assert err.strip() == f"{said} (see 'flowledger {args[0]} --help')"


def test_options_meant_to_repeat_still_take_every_value(database_url: str, pg_schema: str) -> None:
    result = run_cli(database_url, pg_schema, "dashboard", "--by", "model", "--by", "step")
    assert result.returncode == 0, result.stderr
    # grouped by both: the table's first columns are model, then step
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["model", "step", "calls"] for line in lines), result.stdout
