"""How the CLI reports flowledger errors: one line on stderr and an exit code from one table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from flowledger.domain import errors

# Most specific first; FlowledgerError catches the rest.
EXIT_CODES: tuple[tuple[type[errors.FlowledgerError], int], ...] = (
    (errors.ValidationError, 2),
    (errors.UnknownModelPrice, 2),
    (errors.SessionNotFound, 3),
    (errors.TaskNotFound, 3),
    (errors.AgentNotFound, 3),
    (errors.SessionConflict, 4),
    (errors.StepInProgress, 4),
    (errors.StepNotPending, 4),
    (errors.RebuildInProgress, 4),
    (errors.TaskConflict, 4),
    (errors.TaskTransitionRejected, 4),
    (errors.AgentConflict, 4),
    (errors.AgentAtCapacity, 4),
    (errors.TaskNotHeld, 4),
    (errors.SessionExpired, 5),
    (errors.SessionClosed, 5),
    (errors.ConcurrentUpdate, 6),
    (errors.LlmCallFailed, 7),
    (errors.CircuitOpen, 7),
    (errors.LlmNotConfigured, 7),
    (errors.LlmError, 7),
    # The store did not answer within its deadline: retry later (sysexits' EX_TEMPFAIL).
    (errors.StoreUnavailable, 75),
    (errors.FlowledgerError, 1),
)

_stderr = Console(stderr=True)


def exit_code_for(error: errors.FlowledgerError) -> int:
    """The exit code for an error, by the first matching row of EXIT_CODES."""
    return next(code for kind, code in EXIT_CODES if isinstance(error, kind))


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn a FlowledgerError into one line on stderr and its exit code."""
    try:
        yield
    except errors.FlowledgerError as error:
        _stderr.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(exit_code_for(error)) from None
