"""Every command refuses an option that takes one value given twice: ``--since 1h --since 2h``.

click keeps the last one silently, so ``dashboard --since 1h --since 2h`` showed two hours and
said nothing: a line edited in a hurry, or a script that adds its own ``--model`` to a
user's, ran with a value nobody chose knowingly. ``refuse_repeated_options`` makes every
command of the app parse with ``OnceParser``, which refuses such a line as any other usage
error (one ``error:`` line, exit 2). Options meant to repeat (``--skill a --skill b``,
``multiple``, or a count) are untouched, and so is ``--help``, which ends the command anyway.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import typer

# typer vendors click (pinned ~=0.29): its parser and errors are these, not the click package's.
from typer._click.core import Context, Parameter
from typer._click.exceptions import UsageError
from typer._click.parser import _OptionParser
from typer.core import TyperCommand, TyperOption


class OnceParser(_OptionParser):
    """click's parser, refusing an option that takes one value when it is given twice."""

    def parse_args(self, args: list[str]) -> tuple[dict[str, Any], list[str], list[Parameter]]:
        """click's ``(values, leftover args, order)``; the order lists an option once a use."""
        values, leftover, order = super().parse_args(args)
        if self.ctx is None or not self.ctx.resilient_parsing:  # shell completion reads partial lines
            for option, uses in Counter(order).items():
                if uses > 1 and _single_valued(option):
                    names = " / ".join(f"'{name}'" for name in [*option.opts, *option.secondary_opts])
                    raise UsageError(f"Option {names} is given {uses} times; it takes one value", self.ctx)
        return values, leftover, order


def _single_valued(option: Parameter) -> bool:
    return isinstance(option, TyperOption) and not (option.multiple or option.count or option.is_eager)


class OnceCommand(TyperCommand):
    """A typer command parsed by ``parser_class`` (a ``OnceParser``): what every command is."""

    parser_class: type[OnceParser] = OnceParser

    def make_parser(self, ctx: Context) -> _OptionParser:
        """The command's parser: click's ``make_parser``, with ``parser_class``."""
        parser = self.parser_class(ctx)
        for param in self.get_params(ctx):
            param.add_to_parser(parser, ctx)
        return parser


def refuse_repeated_options(app: typer.Typer) -> None:
    """Make every command of ``app`` and of its groups, however deep, a ``OnceCommand``.

    Call it once every command is registered. A command declared with a class of its own must
    make that class a ``OnceCommand`` (``NumberArguments`` is), or this raises ``TypeError``."""
    for command in app.registered_commands:
        if command.cls is None or command.cls is TyperCommand:
            command.cls = OnceCommand
        elif not issubclass(command.cls, OnceCommand):
            raise TypeError(f"{command.cls.__name__} (command {command.name!r}) is not a OnceCommand")
    for group in app.registered_groups:
        if group.typer_instance is not None:
            refuse_repeated_options(group.typer_instance)
