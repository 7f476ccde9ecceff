"""Every CLI command with a number argument takes a negative one as that argument, so the
value's own rule refuses it (``agents capacity a1 -1``), not click's "No such option: -1"."""

from __future__ import annotations

from decimal import Decimal
from typing import get_args

import typer.main
from typer._click.core import Command, Parameter
from typer.core import TyperArgument, TyperGroup

from flowledger.adapters.cli.main import app
from flowledger.adapters.cli.number_arguments import NumberArguments

NUMBERS = (int, float, Decimal)


def _commands(command: Command, path: str = "flowledger") -> list[tuple[str, Command]]:
    if isinstance(command, TyperGroup):
        return [found for name, sub in command.commands.items() for found in _commands(sub, f"{path} {name}")]
    return [(path, command)]


def _is_number_argument(param: Parameter) -> bool:
    if not isinstance(param, TyperArgument):
        return False
    annotation = param.type_descriptor.annotation
    return annotation in NUMBERS or any(inner in NUMBERS for inner in get_args(annotation))


def test_every_command_with_a_number_argument_parses_negative_numbers_as_arguments() -> None:
    numbered = [
        path
        for path, command in _commands(typer.main.get_command(app))
        if any(_is_number_argument(param) for param in command.params)
    ]
    assert numbered, "the CLI has commands with number arguments (agents capacity, fork)"
    assert {"flowledger agents capacity", "flowledger fork"} <= set(numbered)
    for path in numbered:
        command = dict(_commands(typer.main.get_command(app)))[path]
        assert isinstance(command, NumberArguments), f"{path}: use cls=NumberArguments"


def test_a_negative_number_goes_to_the_arguments_and_other_dashes_stay_options() -> None:
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)
    agents = command.commands["agents"]
    assert isinstance(agents, TyperGroup)
    capacity = agents.commands["capacity"]
    for args, expected in ((["a1", "-1"], -1), (["a1", "-1", "--tenant", "t"], -1), (["a1", "7"], 7)):
        context = capacity.make_context("capacity", list(args))
        assert context.params["capacity"] == expected, args
