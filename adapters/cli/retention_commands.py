"""``flowledger retention set|list|remove|run|restore``: closed sessions to verified bundles and back.

See docs/retention.md. ``run`` archives every policy's due sessions (or one workflow's), with
``--dry-run`` only counting them; ``restore`` checks a bundle against its signed proof and
the sessions' bases before putting their events back: a file that cannot be read exits 74,
one that is not a bundle 65, a bundle that does not verify 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flowledger.adapters.cli.audit_commands import json_records, refuse_malformed
from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.number_arguments import whole_number
from flowledger.adapters.cli.rendering import whole_cells
from flowledger.domain.errors import RetentionPolicyNotFound
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from flowledger.projections.retention import archive
from flowledger.projections.retention import restore as restore_sessions
from flowledger.verify import BUNDLE_FORMAT

console = cli_console()
notes = cli_console(stderr=True)
retention_app = typer.Typer(
    help="Archive closed sessions past their workflow's retention to verified bundles; restore them.",
    no_args_is_help=True,
)
TenantOpt = Annotated[
    str | None, typer.Option(help="Whose policies (default: FLOWLEDGER_TENANT or 'default').")
]
WorkflowOpt = Annotated[str, typer.Option("--workflow", help="The workflow the policy is for.")]


def _check_bundle(path: Path) -> None:
    """Refuse a file that is not a bundle before the engine checks its proof (which exits 1).

    Only the header line is read here: a bundle may be large, and the engine reads it whole.
    OSError and UnicodeDecodeError go to the exit-code table (74, 65).
    """
    for number, record in json_records(path, "bundle"):
        if not isinstance(record, dict) or record.get("type") != "header":
            refuse_malformed("bundle", f"line {number}: not a bundle (it starts with no header record)")
        if record.get("format") != BUNDLE_FORMAT:
            refuse_malformed("bundle", f"line {number}: not a bundle of format {BUNDLE_FORMAT}")
        return
    refuse_malformed("bundle", f"{path} is empty")


@retention_app.command("set")
def set_policy(
    workflow: WorkflowOpt,
    days: Annotated[
        int,
        typer.Option(
            "--days", help="Days after a closed session's last event (1..36500).", parser=whole_number
        ),
    ],
    tenant: TenantOpt = None,
) -> None:
    """Keep a workflow's closed sessions in the log for DAYS days after their last event."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        engine.retention.set_policy(workflow, days)
    console.print(f"retention of {workflow}: {days} days", highlight=False)


@retention_app.command("list")
def list_policies(tenant: TenantOpt = None) -> None:
    """The retention policies."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        policies = engine.retention.policies()
    table = Table(title=f"retention policies of {engine.tenant}")
    table.add_column("workflow")
    table.add_column("days", justify="right")
    for workflow, days in policies.items():
        table.add_row(workflow, str(days))
    console.print(whole_cells(table))


@retention_app.command("remove")
def remove_policy(workflow: WorkflowOpt, tenant: TenantOpt = None) -> None:
    """Stop archiving a workflow (exit 3 when it has no policy, as for a budget)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        if not engine.retention.delete_policy(workflow):
            raise RetentionPolicyNotFound(workflow)
    console.print(f"retention of {workflow} removed", highlight=False)


@retention_app.command("run")
def run(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory of the bundles (default: FLOWLEDGER_HOME/archive)."),
    ] = None,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Only this workflow's policy.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be archived; change nothing.")
    ] = False,
    tenant: TenantOpt = None,
) -> None:
    """Archive the closed sessions older than their policy: bundle, base, rows deleted."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        target = out if out is not None else engine.settings.home / "archive"
        report = archive(engine, projector_for(engine), target, workflow=workflow, dry_run=dry_run)
    table = Table(title="would archive (dry run)" if dry_run else f"archived into {target}")
    for column in ("workflow", "days", "sessions", "events", "bundles", "left alone"):
        table.add_column(column, justify="left" if column == "workflow" else "right")
    for part in report.workflows:
        table.add_row(
            part.workflow,
            str(part.days),
            f"{len(part.sessions):,}",
            f"{part.events:,}",
            str(len(part.bundles)),
            str(len(part.skipped)),
        )
    console.print(whole_cells(table))
    for part in report.workflows:
        for bundle in part.bundles:
            console.print(f"bundle: {bundle}", highlight=False, soft_wrap=True)
    rate = report.events / report.seconds if report.seconds > 0 else 0.0
    notes.print(
        f"{report.sessions:,} sessions, {report.events:,} events in {report.seconds:.2f} s"
        f" ({rate:,.0f} rows/s)",
        highlight=False,
    )


@retention_app.command("restore")
def restore(
    bundle: Annotated[Path, typer.Argument(help="A bundle `retention run` wrote.")],
    session: Annotated[
        list[str] | None, typer.Option("--session", help="Only this session (repeat for more).")
    ] = None,
    tenant: TenantOpt = None,
) -> None:
    """Check a bundle's proof and the sessions' bases, then put their events back."""
    with reported_errors():
        _check_bundle(bundle)
        with Engine(tenant=tenant) as engine:
            report = restore_sessions(engine, projector_for(engine), bundle, session or None)
    console.print(
        f"restored {len(report.sessions)} sessions ({report.events} events) from {bundle}",
        highlight=False,
        soft_wrap=True,
    )
    for stream, why in report.skipped.items():
        # Named as a person knows it: "left out stream 13f06d71-...: not asked for" said no session.
        session_id = report.skipped_sessions.get(stream)
        left_out = (
            f"session {session_id!r} (stream {stream})" if session_id is not None else f"stream {stream}"
        )
        notes.print(f"left out {left_out}: {why}", highlight=False, soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    """Add ``retention`` to the top-level app."""
    app.add_typer(retention_app, name="retention")
