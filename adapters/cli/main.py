"""The ``flowledger`` command line: one typer app; each command group lives in its own module.

``main`` is the executable's entry point: the app with click's usage errors (an unknown
command, a missing argument, a value of the wrong type) said as every other refusal is, one
``error:`` line on stderr and exit 2, instead of click's usage block and framed panel.
"""

from __future__ import annotations

import re
import sys
from functools import cache

import typer
import typer.main

# typer vendors click (pinned ~=0.29): its usage errors are these, not the click package's.
from typer._click.core import Command
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from flowledger.adapters.cli import (
    admin_commands,
    agent_commands,
    audit_commands,
    budget_commands,
    keys_commands,
    llm_commands,
    price_commands,
    projection_commands,
    retention_commands,
    serve,
    session_commands,
    task_commands,
)
from flowledger.adapters.cli.errors import joined, say_error
from flowledger.adapters.cli.single_values import refuse_repeated_options

app = typer.Typer(
    name="flowledger",
    help="Event-sourced state for LLM workflow sessions and tasks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
session_commands.register(app)
llm_commands.register(app)
serve.register(app)
audit_commands.register(app)
projection_commands.register(app)
admin_commands.register(app)
keys_commands.register(app)
budget_commands.register(app)
price_commands.register(app)
retention_commands.register(app)
task_commands.register(app)
agent_commands.register(app)
refuse_repeated_options(app)  # last: every command is registered by now


def main(args: list[str] | None = None) -> None:
    """Run the command line on ``args`` (else ``sys.argv``); exits with the command's code."""
    try:
        code = _command()(args=args, prog_name="flowledger", standalone_mode=False)
    except NoArgsIsHelpError as bare:  # a group named without a command: its help, as click does
        typer.echo(bare.ctx.get_help() if bare.ctx is not None else "")
        code = bare.exit_code
    except UsageError as error:
        hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
        # click puts a choice list on lines of its own: one line, as every refusal
        say_error(joined(f"{_without_pydantic_prefix(error.format_message())}{hint}"))
        code = error.exit_code
    except ClickException as error:
        say_error(joined(error.format_message()))
        code = error.exit_code
    except typer.Abort:
        say_error("aborted")
        code = 1
    except typer.Exit as done:  # raised by commands (``fail``), outside click's own main
        code = done.exit_code
    sys.exit(code if isinstance(code, int) else 0)


@cache
def _command() -> Command:
    """The app as click's command, built once: calling the app (``app(...)``) builds it again
    from every command's signature and type hints, 0.1-0.2 s of CPU each time, and ``main``
    runs many times in one process where it is embedded (the tests run every command so).
    Built at the first call, after every module has registered its commands."""
    return typer.main.get_command(app)


_PYDANTIC_PREFIX = re.compile(r"^(Invalid value for '[^']*': )Value error, ")
"""typer reads an enumerated value through pydantic, whose refusal begins "Value error, ":
``budgets set nope ...`` said "Invalid value for 'scope': Value error, 'nope' is not one of ..."."""


def _without_pydantic_prefix(message: str) -> str:
    """A usage error's message without pydantic's "Value error, " after the parameter's name."""
    return _PYDANTIC_PREFIX.sub(r"\1", message)


if __name__ == "__main__":  # pragma: no cover
    main()
