"""How the CLI reports errors: one line on stderr and an exit code from one table.

Every error a command meets ends this way, not only flowledger's own: a file the user named
that cannot be read or written, the database failing outside the store's handling (a lost
connection is ``StoreUnavailable`` wherever it surfaces), and, as a
last resort, a bug (its type named, so it can be reported). Exits that typer and click raise
on purpose (``typer.Exit``, usage errors) pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import click
import psycopg
import typer
from rich.markup import escape

from flowledger.adapters.cli.consoles import cli_console
from flowledger.domain import errors
from flowledger.infrastructure.outages import CONNECTION_ERRORS, unavailable
from flowledger.infrastructure.postgres.database import forbidden, refused_privilege

# Most specific first; Exception catches the rest. Codes from 64 up follow sysexits.h.
EXIT_CODES: tuple[tuple[type[Exception], int], ...] = (
    (errors.ValidationError, 2),
    (errors.IdempotencyKeyOfAnotherKind, 2),  # a key that names another kind of request
    (errors.IdempotencyKeyReused, 2),  # a payload that does not fit its key: bad input
    (errors.TaskIdempotencyKeyReused, 2),
    # typer vendors click: its BadParameter is no click.ClickException, so it lands here.
    (typer.BadParameter, 2),
    (errors.UnknownModelPrice, 2),
    (errors.BudgetNotFound, 3),
    (errors.RetentionPolicyNotFound, 3),
    (errors.SessionArchived, 3),  # a SessionNotFound: said first, so it keeps its own entry
    (errors.SessionNotYetStarted, 3),  # a SessionNotFound as of a time before its start
    (errors.SessionNotFound, 3),
    (errors.TaskNotFound, 3),
    (errors.AgentNotFound, 3),
    (errors.SessionConflict, 4),
    (errors.SessionOwnedByAnother, 4),
    (errors.StepInProgress, 4),
    (errors.StepNotPending, 4),
    (errors.RebuildInProgress, 4),
    (errors.AuditError, 1),
    (errors.TaskConflict, 4),
    (errors.TaskNeedsClassification, 4),
    (errors.TaskAssignmentChanged, 4),
    (errors.TaskTransitionRejected, 4),
    (errors.AgentConflict, 4),
    (errors.AgentAtCapacity, 4),
    (errors.TaskNotHeld, 4),
    (errors.BudgetLedgerDamaged, 8),  # refused unsent, as a call past its budget
    (errors.BudgetExceeded, 8),
    (errors.SessionExpired, 5),
    (errors.SessionClosed, 5),
    (errors.ConcurrentUpdate, 6),
    (errors.LlmCallFailed, 7),
    (errors.CircuitOpen, 7),
    (errors.LlmNotConfigured, 7),
    # The LLM adapter's set-up cannot make the call: sysexits' EX_CONFIG (it was 2, a usage error).
    (errors.LlmMisconfigured, 78),
    (errors.LlmError, 7),
    # The engine closed before a step's paid answer was saved: retry under the key (EX_TEMPFAIL).
    (errors.AnswerNotSaved, 75),
    (errors.StepInterrupted, 75),  # the same, closed before the model answered
    # A command ran on an engine already closed: a bug in flowledger, not an outage (EX_SOFTWARE).
    (errors.EngineClosed, 70),
    # The store did not answer within its deadline: retry later (sysexits' EX_TEMPFAIL).
    # The schema needs its owner (a role without the privilege to migrate it): EX_NOPERM.
    (errors.MigrationRefused, 77),
    (errors.StoreForbidden, 77),  # the role lacks a privilege (a read-only role writing)
    (errors.WriteRefusedByDatabase, 1),  # a trigger or constraint added in the database
    (errors.StoreRefused, 1),
    (errors.StoreUnavailable, 75),
    # A row of the log changed in the database so that it no longer reads: bad data (EX_DATAERR).
    (errors.StoredEventUnreadable, 65),
    (errors.StoredEventMissing, 65),
    (errors.StoredEventOutOfOrder, 65),
    (errors.StoredEventAltered, 65),
    (errors.ArchivedBaseForged, 65),
    (errors.LogDamaged, 65),  # the log as a whole: its events table dropped, an index not remade
    (errors.FlowledgerError, 1),
    # A file named on the command line: missing, a directory, not writable (EX_IOERR) ...
    (OSError, 74),
    # ... or not text (EX_DATAERR; ``NotUtf8Text`` names the file).
    (UnicodeDecodeError, 65),
    # (A connection that failed or broke mid-command, in psycopg's words or the event library's,
    # is reported as StoreUnavailable: see ``reported_errors``.)
    (psycopg.Error, 1),
    # Anything else is a bug in flowledger (EX_SOFTWARE).
    (Exception, 70),
)


class NotUtf8Text(UnicodeDecodeError):
    """A file the user named is not UTF-8 text: the decoder's error, with the file's ``path``."""

    def __init__(self, path: Path, error: UnicodeDecodeError) -> None:
        super().__init__(error.encoding, error.object, error.start, error.end, error.reason)
        self.path = path


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Reads of ``path``, a file the user named, in the block: bytes that are not UTF-8 come
    out as ``NotUtf8Text``, so the error line says which file (exit 65 all the same)."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise NotUtf8Text(path, error) from None


_stderr = cli_console(stderr=True)
_DELIBERATE = (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException)
"""Raised by commands on purpose (an exit code, a usage error): they subclass RuntimeError."""


def exit_code_for(error: Exception) -> int:
    """The exit code for an error, by the first matching row of EXIT_CODES."""
    return next(code for kind, code in EXIT_CODES if isinstance(error, kind))


def one_line(error: Exception) -> str:
    """The error as one line: what went wrong and on what, without a traceback."""
    if isinstance(error, errors.FlowledgerError):
        text = str(error)
    elif isinstance(error, typer.BadParameter):
        # Worded as a ValidationError is: "host: ...", the option's name without its dashes.
        text = f"{str(error.param_hint or 'value').lstrip('-')}: {error.message}"
    elif isinstance(error, OSError) and error.strerror and error.filename is not None:
        text = f"{error.filename}: {error.strerror}"
    elif isinstance(error, UnicodeDecodeError):
        # A text reader decodes in chunks: its offset is into a chunk, not the file, so a
        # named file's line gives none.
        text = (
            f"{error.path}: not UTF-8 text ({error.reason})"
            if isinstance(error, NotUtf8Text)
            else f"not UTF-8 text: byte {error.start} ({error.reason})"
        )
    elif isinstance(error, OSError | psycopg.Error):
        text = str(error) or type(error).__name__
    else:
        text = f"unexpected {type(error).__name__} (a bug in flowledger): {error}"
    # psycopg adds DETAIL / HINT / LINE lines; a message may quote input with newlines.
    return joined(text)


def joined(text: str) -> str:
    """``text``'s non-blank lines, stripped, on one line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn any error into one line on stderr and its exit code (see EXIT_CODES)."""
    try:
        yield
    except _DELIBERATE:
        raise
    except Exception as error:
        if isinstance(error, CONNECTION_ERRORS):
            # It escaped the engine's own handling: still an outage (exit 75), not a bug (70).
            error = unavailable(_command(), error)
        elif not isinstance(error, errors.FlowledgerError) and refused_privilege(error):
            error = forbidden(_command(), error)  # the role's privileges, not a bug (77, not 70)
        fail(one_line(error), exit_code_for(error))


def _command() -> str:
    """The running command's words (``projections status``), or "command" outside one."""
    context = click.get_current_context(silent=True)
    words = context.command_path.split()[1:] if context is not None else []
    return " ".join(words) or "command"


def fail(message: str, code: int) -> NoReturn:
    """End the command: ``message`` as the one ``error:`` line on stderr, and exit ``code``."""
    say_error(message)
    raise typer.Exit(code) from None


def say_problem(label: str, message: str) -> None:
    """A finding the command goes on past (``label: message``), one line on stderr; the
    command ends with an ``error:`` line (``fail``) once it has named them all."""
    _stderr.print(f"[red]{escape(label)}:[/red] {escape(joined(message))}", highlight=False, soft_wrap=True)


def say_error(message: str) -> None:
    """``message`` as the one ``error:`` line on stderr."""
    # Escaped: a message quoting "[x]" would otherwise be read as rich markup and vanish.
    _stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
