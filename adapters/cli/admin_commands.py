"""CLI commands for operators: ``migrate`` prepares the database once, before engines start."""

from __future__ import annotations

import typer

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.infrastructure import Settings
from flowledger.infrastructure.postgres.database import migrate_command
from flowledger.infrastructure.postgres.migrations import SCHEMA_VERSION

console = cli_console()


def migrate() -> None:
    """Create or upgrade flowledger's tables and enforce the log's invariants (safe to repeat).

    Engines run the same step when they start (under an advisory lock, once per database);
    running it first keeps DDL out of a deployment's start-up path. Only this command converts
    an existing events table to the layout ``FLOWLEDGER_EVENT_PARTITIONS`` asks for.
    """
    with reported_errors():
        report = migrate_command(Settings.from_env())
    if report.version > SCHEMA_VERSION:
        done = f"newer than this flowledger's {SCHEMA_VERSION}, left as it is (upgrade flowledger)"
    else:
        done = "created or upgraded" if report.created else "already current"
    console.print(f"schema {report.schema!r} at version {report.version}: {done}")
    layout = f"{report.partitions} hash partitions by stream" if report.partitions else "unpartitioned"
    if report.rows_moved is not None:
        console.print(f"events table converted to {layout}: {report.rows_moved} rows moved")
    else:
        console.print(f"events table: {layout}")
    if report.sequence_cache_reset:
        console.print(
            "the notification sequence had a cache: set to CACHE 1 (a cache lets followers skip ids)"
        )
    if report.functions_remade:
        console.print(
            "the append functions named another schema (renamed or restored under this name): made again"
        )
    if report.indexes_made:
        console.print(
            f"the events table had lost unique indexes; made again: {', '.join(report.indexes_made)}"
        )
    if report.sequence_repairs:
        console.print(
            "the notification sequence could hand out ids at or below stored ones (followers skip"
            f" them): {'; '.join(report.sequence_repairs)}"
        )
    if report.foreign_rows_repaired:
        console.print(
            f"{report.foreign_rows_repaired} rows carried transaction ids from another cluster "
            "(a restore): rewritten so that readers see them"
        )


def register(app: typer.Typer) -> None:
    """Add the operator commands to ``app``."""
    app.command()(migrate)
