"""``flowledger audit verify`` and ``flowledger audit export``.

A read of the log that the read horizon held back is reported as partial (exit 75, "try
again"), never as ok.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from flowledger.adapters.cli.errors import reported_errors
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import (
    AuditReport,
    ReadExtent,
    export_records,
    verify_export,
    verify_log,
)

audit = typer.Typer(help="Check the event log, and export it with a hash chain.", no_args_is_help=True)
console = Console(stderr=True)
PARTIAL_EXIT = 75
"""Like a database that did not answer: nothing is wrong that trying again will not fix."""


def _report(report: AuditReport, what: str) -> None:
    for problem in report.problems[:50]:
        console.print(f"[red]problem:[/red] {problem}", highlight=False)
    if len(report.problems) > 50:
        console.print(f"... and {len(report.problems) - 50} more")
    if report.problems:
        verdict = f"[red]{len(report.problems)} problems[/red]"
    elif report.partial:
        verdict = "[yellow]no problems in what was read, but the read was partial[/yellow]"
    else:
        verdict = "[green]ok[/green]"
    console.print(f"{what}: {report.events:,} events in {report.streams:,} streams: {verdict}")
    if report.extent is not None and report.partial:
        console.print(f"[yellow]{report.extent.describe()}[/yellow]", highlight=False)
    if report.problems:
        raise typer.Exit(1)
    if report.partial:
        raise typer.Exit(PARTIAL_EXIT)


@audit.command()
def verify(
    file: Annotated[Path | None, typer.Option(help="Check an exported file's hash chain instead.")] = None,
) -> None:
    """Check that every stored event decodes and every stream's versions are contiguous."""
    with reported_errors():
        if file is not None:
            with file.open(encoding="utf-8") as lines:
                _report(verify_export(lines), str(file))
            return
        with Engine() as engine, Progress(console=console, transient=True) as progress:
            task = progress.add_task("verifying the event log", total=None)
            report = verify_log(engine.log, progress=lambda n: progress.advance(task, n))
        _report(report, "event log")


@audit.command()
def export(
    session: Annotated[str | None, typer.Option(help="Only this session's events.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write here instead of standard output.")] = None,
) -> None:
    """Write events as JSON lines, each carrying the hash of the line before it."""
    with reported_errors(), Engine() as engine:
        aggregate_id = None
        if session is not None:
            engine.history(session)  # raises SessionNotFound with the caller's id
            aggregate_id = engine.session_uuid(session)
        target = out.open("w", encoding="utf-8") if out is not None else sys.stdout
        partial: ReadExtent | None = None
        try:
            count = 0
            for record in export_records(engine.log, aggregate_id):
                target.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 0 if record.get("trailer") else 1
                if record.get("partial"):
                    partial = ReadExtent(record["read_through"], record["committed_through"])
        finally:
            if out is not None:
                target.close()
        console.print(f"exported {count:,} events" + (f" to {out}" if out else ""))
        if partial is not None:
            console.print(
                f"[yellow]the export is incomplete (its trailer says so): {partial.describe()}[/yellow]",
                highlight=False,
            )
            raise typer.Exit(PARTIAL_EXIT)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` group to the top-level app."""
    app.add_typer(audit, name="audit")
