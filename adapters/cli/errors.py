"""How the CLI reports flowledger errors: one line on stderr and an exit code from one table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from flowledger.domain.errors import (
    ConcurrentUpdate,
    FlowledgerError,
    SessionClosed,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    ValidationError,
)

# Most specific first; FlowledgerError catches the rest.
EXIT_CODES: tuple[tuple[type[FlowledgerError], int], ...] = (
    (ValidationError, 2),
    (SessionNotFound, 3),
    (SessionConflict, 4),
    (SessionExpired, 5),
    (SessionClosed, 5),
    (ConcurrentUpdate, 6),
    (FlowledgerError, 1),
)

_stderr = Console(stderr=True)


def exit_code_for(error: FlowledgerError) -> int:
    """The exit code for an error, by the first matching row of EXIT_CODES."""
    return next(code for kind, code in EXIT_CODES if isinstance(error, kind))


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn a FlowledgerError into one line on stderr and its exit code."""
    try:
        yield
    except FlowledgerError as error:
        _stderr.print(f"[red]error:[/red] {error}", highlight=False)
        raise typer.Exit(exit_code_for(error)) from None
