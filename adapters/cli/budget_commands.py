"""``flowledger budgets set|list|remove``: spending limits checked before each model call."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.rendering import whole_cells
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.budgets import Burn

console = cli_console()
notes = cli_console(stderr=True)
budgets_app = typer.Typer(
    help="Budgets in USD per tenant, user, session, workflow or model, per day, month or in total.",
    no_args_is_help=True,
)
TENANT_HELP = "Whose budgets (default: FLOWLEDGER_TENANT or 'default')."


class Scope(StrEnum):
    """What a budget limits."""

    tenant = "tenant"
    user = "user"
    session = "session"
    workflow = "workflow"
    model = "model"


class Period(StrEnum):
    """A budget's window."""

    day = "day"
    month = "month"
    total = "total"


class Mode(StrEnum):
    """Refuse calls past the limit, or only raise alerts."""

    enforce = "enforce"
    alert = "alert"


ScopeArg = Annotated[Scope, typer.Argument(help="tenant, user, session, workflow or model.")]
SubjectArg = Annotated[
    str | None, typer.Argument(help="The user, session, workflow or model id (none for tenant).")
]
PeriodOpt = Annotated[Period, typer.Option("--period", help="day, month (UTC) or total.")]
TenantOpt = Annotated[str | None, typer.Option(help=TENANT_HELP)]


@budgets_app.command("set")
def set_budget(
    scope: ScopeArg,
    subject: SubjectArg = None,
    period: PeriodOpt = Period.day,
    limit: Annotated[str, typer.Option("--limit", help="USD, exact (e.g. 25 or 0.50); more than 0.")] = "",
    mode: Annotated[
        Mode, typer.Option(help="enforce: refuse calls past it; alert: only alert.")
    ] = Mode.enforce,
    webhook_url: Annotated[
        str | None, typer.Option(help="POSTed a signed JSON alert at 50/80/100 %.")
    ] = None,
    webhook_secret: Annotated[
        str | None, typer.Option(help="HMAC key for the webhook (made and shown once if omitted).")
    ] = None,
    tenant: TenantOpt = None,
) -> None:
    """Set (or change) a budget."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        from flowledger.adapters.llm.alerts import require_public_destination  # (httpx: not at start-up)

        require_public_destination(webhook_url, allow_private=engine.settings.webhook_allow_private)
        if scope is Scope.model and engine.budgets.charged_as is None and engine.settings.llm_base_url:
            # The server calling the model (same settings) charges its calls by this table's names.
            from flowledger.adapters.llm.pricing import load_price_table

            table = load_price_table(engine.settings.pricing_file)
            engine.budgets.charged_as = lambda name: table.resolve(name) or name
        made = engine.budgets.set(
            scope.value,
            subject,
            period.value,
            limit,
            mode=mode.value,
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
        )
    spec = made.spec
    verb = "set" if made.changed else "unchanged"
    console.print(
        f"budget {spec.scope}:{spec.subject} per {spec.period}: ${spec.limit_usd:f} ({spec.mode}) {verb}",
        highlight=False,
    )
    if made.webhook_secret is not None:
        notes.print("webhook secret, shown this once:", highlight=False)
        print(made.webhook_secret)


def budget_row(burn: Burn) -> list[str]:
    """One budget's cells for ``budgets list``, amounts as plain decimals (the ledger's numeric
    columns come back as e.g. ``Decimal('0E-9')``, which ``str`` prints as such)."""
    spec = burn.spec
    window = "all time" if spec.period == "total" else f"{burn.window_start:%Y-%m-%d}"
    amounts = (burn.spent_usd, burn.reserved_usd, spec.limit_usd, burn.percent)
    return [spec.scope, spec.subject, spec.period, spec.mode, window, *(format(a, "f") for a in amounts)]


@budgets_app.command("list")
def list_budgets(tenant: TenantOpt = None) -> None:
    """The budgets with their current window's burn: spent, reserved, limit, percent."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        burns = engine.budgets.burn()
    table = Table(title=f"budgets of {engine.tenant}")
    for column in ("scope", "subject", "period", "mode", "window", "spent $", "reserved $", "limit $", "%"):
        table.add_column(column, justify="right" if column.endswith(("$", "%")) else "left")
    for burn in burns:
        table.add_row(*budget_row(burn))
    console.print(whole_cells(table))


@budgets_app.command("remove")
def remove_budget(
    scope: ScopeArg, subject: SubjectArg = None, period: PeriodOpt = Period.day, tenant: TenantOpt = None
) -> None:
    """Remove a budget (exit 3 when none is set)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        engine.budgets.remove(scope.value, subject, period.value)
    console.print(
        f"budget {scope.value}:{subject or engine.tenant} per {period.value} removed", highlight=False
    )


def register(app: typer.Typer) -> None:
    """Add ``budgets`` to the top-level app."""
    app.add_typer(budgets_app, name="budgets")
