"""CLI commands that read sessions: ``history`` and ``replay``; and ``demo``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console

from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.rendering import history_table, session_table
from flowledger.domain.bounds import require_count
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine

console = Console()


def history(session_id: Annotated[str, typer.Argument(help="The caller's session id.")]) -> None:
    """Print a session's events, oldest first."""
    with reported_errors(), Engine() as engine:
        console.print(history_table(session_id, engine.history(session_id)))


def replay(
    session_id: Annotated[str, typer.Argument(help="The caller's session id.")],
    version: Annotated[int | None, typer.Option(help="Replay up to this version.")] = None,
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="Replay as it was at this ISO time (with zone).")
    ] = None,
) -> None:
    """Print a session's state as it was at a version or a moment."""
    with reported_errors():
        moment = _parse_time(as_of) if as_of is not None else None
        with Engine() as engine:
            console.print(session_table(engine.get_session(session_id, version=version, as_of=moment)))


def demo(
    sessions: Annotated[int, typer.Option(help="How many scripted sessions to run.")] = 300,
) -> None:
    """Run the demo job on the embedded PostgreSQL (or FLOWLEDGER_DATABASE_URL)."""
    from flowledger.adapters.cli.demo import run_demo

    with reported_errors():
        require_count("sessions", sessions, least=1, most=1_000_000)
        run_demo(console, sessions=sessions)


def _parse_time(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError("as_of", f"{text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise ValidationError("as_of", "needs a time zone, e.g. 2026-11-30T10:00:00+00:00")
    return moment


def register(app: typer.Typer) -> None:
    """Add these commands to the top-level app."""
    app.command()(history)
    app.command()(replay)
    app.command()(demo)
