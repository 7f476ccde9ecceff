"""A command whose arguments may be negative numbers: ``agents capacity a1 -1``.

click takes every word starting with ``-`` for an option, so ``-1`` was refused as
"No such option: -1" before the domain could say what is wrong with it (a capacity below
0). Commands with a number argument use ``NumberArguments``: a word that reads as a number
and names no option of the command is an argument, and the value's own check answers.
"""

from __future__ import annotations

import re

import typer

# typer vendors click (pinned ~=0.29): its parser is this one, not the click package's.
from typer._click.parser import _ParsingState

from flowledger.adapters.cli.single_values import OnceCommand, OnceParser

_NUMBER = re.compile(r"-(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


class _NumbersAreArguments(OnceParser):
    """The commands' parser, but a negative number that is no option goes to the arguments."""

    def _process_opts(self, arg: str, state: _ParsingState) -> None:
        if _NUMBER.fullmatch(arg) and arg not in self._short_opt and arg not in self._long_opt:
            state.largs.append(arg)
            return
        super()._process_opts(arg, state)


class NumberArguments(OnceCommand):
    """A typer command whose arguments may be negative numbers (``cls=NumberArguments``)."""

    parser_class = _NumbersAreArguments


_WHOLE = re.compile(r"-?[0-9]+")


def whole_number(text: str) -> int:
    """An integer option or argument as written in ASCII digits (a '-' before them at most):
    click's reading, through ``int()``, took ``1_0``, ``+5`` and `` 5`` (as 10, 5 and 5).
    ``parser=whole_number`` on a ``typer.Option`` or ``typer.Argument``."""
    if not isinstance(text, str):  # a default, already a number
        return int(text)
    if not _WHOLE.fullmatch(text):
        raise typer.BadParameter(f"Input should be a valid integer in ASCII digits, like 10 (got {text!r})")
    return int(text)


# ``inf`` and ``nan`` are read, so that the value's own check says what is wrong with them.
_REAL = re.compile(r"-?(([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def real_number(text: str) -> float:
    """A number option written in ASCII digits, with a fraction or an exponent if need be
    (``0.5``, ``1e-3``): ``float()`` also took ``1_0``, `` 5`` and ``+5``.
    ``parser=real_number`` on a ``typer.Option``."""
    if not isinstance(text, str):  # a default, already a number
        return float(text)
    if not _REAL.fullmatch(text):
        raise typer.BadParameter(
            f"Input should be a valid number in ASCII digits, like 2 or 0.5 (got {text!r})"
        )
    return float(text)
