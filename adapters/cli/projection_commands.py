"""CLI for the read models: ``projections rebuild|status|follow|verify``, ``dashboard`` and ``funnel``.

Analytics show one tenant: ``--tenant``, else the engine's (``Engine(tenant=...)``, the
settings' tenant). ``projections tenant-views`` makes a schema of one tenant's views for SQL tools.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console, shown_name, transient_progress
from flowledger.adapters.cli.errors import fail, joined, reported_errors, say_problem
from flowledger.adapters.cli.rendering import money, whole_cells
from flowledger.adapters.cli.task_rendering import tiers_table
from flowledger.adapters.durations import parse_since
from flowledger.adapters.group_labels import group_label
from flowledger.adapters.llm.pricing import load_price_table
from flowledger.domain.bounds import require_name, require_tenant
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from flowledger.projections import (
    DashboardRow,
    FunnelReport,
    Projector,
    dashboard,
    dead_letter_events,
    follow_until_stopped,
    funnel_report,
    projector_for,
    rebuild,
    recent_dead_letters,
    reprice,
    status,
    tenant_views,
    verify,
    workflows,
)
from flowledger.projections.cost_queries import GROUPINGS, read_for
from flowledger.projections.tier_queries import CONFIGURED, reprice_by_tier, tier_policies

console = cli_console()
projections_app = typer.Typer(
    help="Rebuild, follow, verify and inspect the read models.", no_args_is_help=True
)
BY_HELP = f"{', '.join(list(GROUPINGS)[:-1])} or {list(GROUPINGS)[-1]} (repeatable)."
"""Every grouping the dashboard knows (``session`` was missing when this was written by hand)."""
REPRICE_HELP = "Also price the same usage at this model's price (the configured price table)."
TIERS_HELP = (
    "Also price the task calls as if each model-tier policy had routed them (GET /v1/dashboard/tiers)."
)
NAME_HELP = "One projection: current_state, cost, funnel or seed (default: all)."
STEPS_HELP = "Step order, comma-separated (default: the order sessions reached them)."
STEP_HELP = "A step of the order, its name as written (repeatable; for names holding a comma)."
TENANT_HELP = "Whose data (default: the engine's tenant, FLOWLEDGER_TENANT or 'default')."
TenantOption = Annotated[str | None, typer.Option(help=TENANT_HELP)]


def _tenant(engine: Engine, tenant: str | None) -> str:
    """``--tenant`` (checked as a name, as everywhere a tenant is given), else the engine's."""
    return engine.tenant if tenant is None else require_tenant(tenant)


@contextmanager
def progress_bar(projector: Projector, label: str) -> Iterator[Any]:
    """A rich progress bar over the log, advanced to each batch's last notification id."""
    head = projector.head()
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with transient_progress(console, *columns) as bar:
        task = bar.add_task(label, total=head)
        yield lambda position: bar.update(task, completed=min(position, head))


def _names(name: str | None) -> list[str] | None:
    """None (every projection) when no name is given; an empty or blank one is refused, not
    read as "all" (an unset shell variable must not rebuild everything)."""
    return None if name is None else [require_name("name", name)]


@projections_app.command("rebuild")
def rebuild_command(name: Annotated[str | None, typer.Argument(help=NAME_HELP)] = None) -> None:
    """Rebuild from the first event into fresh tables, then switch readers to them."""
    with reported_errors(), Engine() as engine:
        projector = projector_for(engine, batch_size=5000)
        projector.select(_names(name))  # an unknown name is refused before any output
        with progress_bar(projector, "rebuilding") as advance:
            schemas = rebuild(projector, _names(name), progress=advance)
        for projection, schema in schemas.items():
            console.print(f"[green]rebuilt[/green] {projection} → {schema}")
        _report_dead_letters(projector, set(schemas.values()))


def _report_dead_letters(projector: Projector, built: set[str]) -> None:
    """Name the events the new builds set aside (the first 20) and exit 1 if there are any:
    the builds are live all the same (a dead letter never wedges them), but a rebuild that
    could not apply a row (one changed in the database, say) must not pass for a clean one."""
    set_aside = sum(b.dead_letters for b in status(projector) if b.schema in built)
    if not set_aside:
        return
    for letter in reversed(recent_dead_letters(projector, schemas=built)):
        say_problem(
            "dead letter",
            f"{letter.projection}: event {letter.notification_id} (stream {letter.originator_id}"
            f" version {letter.originator_version}, {letter.topic}): {letter.error}",
        )
    fail(
        f"the new builds set aside {_events_as_letters(projector, built, set_aside)} (readers use the"
        " builds all the same): see `flowledger projections status`",
        1,
    )


def _events_as_letters(projector: Projector, builds: set[str], letters: int) -> str:
    """'1 event as 4 dead letters': an event is a dead letter of every build that set it aside."""
    events = dead_letter_events(projector, builds)
    return f"{events} event{'' if events == 1 else 's'} as {letters} dead letter{'' if letters == 1 else 's'}"


@projections_app.command("status")
def status_command() -> None:
    """Each build's position, lag behind the head of the log and dead letters; the newest dead letters."""
    with reported_errors(), Engine() as engine:
        projector = projector_for(engine)
        table = Table(title="projections")
        numbers = {"position", "head", "lag", "events", "dead letters"}
        columns = (
            "projection",
            "state",
            "schema",
            "position",
            "head",
            "lag",
            "events",
            "dead letters",
            "updated",
        )
        for column in columns:
            table.add_column(column, justify="right" if column in numbers else "left")
        for build in status(projector):
            dead = f"[red]{build.dead_letters}[/red]" if build.dead_letters else "0"
            table.add_row(
                build.projection,
                build.state,
                build.schema,
                str(build.position),
                str(build.head),
                str(build.lag),
                str(build.events),
                dead,
                build.updated_at.isoformat(timespec="seconds"),
            )
        console.print(whole_cells(table))
        _print_horizon(projector)
        letters = recent_dead_letters(projector)
        if letters:
            out = Table(title="dead letters of the live builds (newest first; a rebuild applies them again)")
            for column in ("projection", "notification", "topic", "aggregate v", "error"):
                out.add_column(column, overflow="fold")
            for d in letters:
                out.add_row(
                    d.projection,
                    str(d.notification_id),
                    escape(d.topic),
                    f"{d.originator_id} v{d.originator_version}",
                    escape(d.error),  # may quote a stored value: "[/x]" was read as a closing tag
                )
            console.print(out, highlight=False)


def _print_horizon(projector: Projector) -> None:
    """How far the log's readers are held back, where the recorder can tell."""
    lag = getattr(projector.recorder, "horizon_lag", None)
    if lag is None:
        return
    horizon = lag()
    age = "unknown" if horizon.age_s is None else f"{horizon.age_s:.1f} s"
    console.print(
        f"read horizon: {horizon.readable_id} of {horizon.committed_id} committed"
        f" ({horizon.held_back} held back, oldest append in flight open for {age})",
        highlight=False,
    )


@projections_app.command("tenant-views")
def tenant_views_command(tenant: Annotated[str, typer.Argument(help="The tenant.")]) -> None:
    """Create (or refresh) a schema of views showing only one tenant's rows; print its name."""
    with reported_errors(), Engine() as engine:
        console.print(tenant_views(projector_for(engine), require_tenant(tenant)), highlight=False)


@projections_app.command("follow")
def follow_command(name: Annotated[str | None, typer.Argument(help=NAME_HELP)] = None) -> None:
    """Keep the projections current from live notifications until interrupted."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with reported_errors(), Engine() as engine:
        projector = projector_for(engine)
        projector.select(_names(name))  # an unknown name is refused before any output
        console.print("following the log (Ctrl-C to stop)")

        def reconnecting(error: BaseException, wait_s: float) -> None:
            # One line, escaped: psycopg's "server closed the connection unexpectedly" runs
            # over three, which a log reader grepping for "lost the database" found a third of.
            what = escape(joined(f"{type(error).__name__}: {error}"))
            console.print(
                f"[yellow]lost the database ({what}); starting again in {wait_s:.1f} s[/yellow]",
                highlight=False,
                soft_wrap=True,
            )

        follow_until_stopped(projector, _names(name), stop=stop, on_reconnect=reconnecting)
        console.print("stopped")


@projections_app.command("verify")
def verify_command(name: Annotated[str | None, typer.Argument(help=NAME_HELP)] = None) -> None:
    """Rebuild into a scratch schema and compare with the live tables; exit 1 on any difference."""
    with reported_errors(), Engine() as engine:
        projector = projector_for(engine, batch_size=5000)
        projector.select(_names(name))  # an unknown name is refused before any output
        with progress_bar(projector, "verifying") as advance:
            differences = verify(projector, _names(name), progress=advance)
        if not differences:
            console.print("[green]live tables equal a rebuild from the log, at the head of the log[/green]")
            live = [b for b in status(projector) if b.state == "live"]
            dead = sum(b.dead_letters for b in live)
            if dead:
                same = _events_as_letters(projector, {b.schema for b in live}, dead)
                console.print(
                    f"[yellow]both set aside the same {same}: see `flowledger projections status`[/yellow]"
                )
            return
        table = Table(title="differences")
        for column in ("projection", "table", "side", "row"):
            table.add_column(column)
        for d in differences:
            # A row holds the callers' names: "[/x]" was read as a closing tag (MarkupError, exit 70).
            table.add_row(d.projection, d.table, d.side, escape(d.row))
        console.print(whole_cells(table))
        raise typer.Exit(1)


def dashboard_table(rows: list[DashboardRow], by: list[str], title: str) -> Table:
    """The cost dashboard as a rich table, readable at 80 characters: no cell cut short."""
    table = Table(
        title=f"{title} (latency: avg p50/p95/p99)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for i, column in enumerate(by):
        widest = max((len(group_label(r.group[i], column)) for r in rows), default=len(column))
        table.add_column(column, no_wrap=True, min_width=min(widest, 24))
    for column in ("calls", "errors", "tokens in/out/cached", "cost $", "latency ms"):
        wraps = column == "errors"
        table.add_column(column, justify="right", no_wrap=not wraps, min_width=6 if wraps else None)
    for r in rows:
        errors = ", ".join(f"{k}:{v}" for k, v in sorted(r.errors_by_type.items())) or "0"
        tokens = "/".join(_short(n) for n in (r.input_tokens, r.output_tokens, r.cached_tokens))
        latency = f"{_ms(r.latency_avg_ms)} " + "/".join(
            _ms(v) for v in (r.latency_p50_ms, r.latency_p95_ms, r.latency_p99_ms)
        )
        table.add_row(
            *_group_cells(r.group, by),
            f"{r.calls:,}",
            escape(errors),
            tokens,
            money(r.cost_usd, 4) + (f" +{r.unpriced_calls} unpriced" if r.unpriced_calls else ""),
            latency,
        )
    return whole_cells(table)


def _group_cells(group: tuple[Any, ...], by: list[str]) -> list[str]:
    """A row's group as table cells: calls with no model read ``(no model)``, and a model named
    so reads ``"(no model)"`` (``group_labels``); markup and controls as written."""
    return [escape(shown_name(group_label(g, column))) for g, column in zip(group, by, strict=False)]


def _short(count: int) -> str:
    """1,234 -> 1.2k; 2,500,000 -> 2.5M; 999,999 -> 1.0M; 12,345,678,901 -> 12.3B. The unit is
    chosen after rounding: before, 999,999 read 1000.0k (and a billion 1000.0M)."""
    if count < 1_000:
        return str(count)
    for size, unit in ((1_000, "k"), (1_000_000, "M")):
        shown = f"{count / size:.1f}"
        if float(shown) < 1_000:
            return f"{shown}{unit}"
    return f"{count / 1_000_000_000:.1f}B"


def funnel_table(report: FunnelReport, by: str | None = None) -> Table:
    """One workflow's funnel: reach, conversion of all sessions and of the step before, why
    sessions stopped there, how many are still running or done, and time to reach it; broken
    down ``by`` a model or metadata key, its segment in the title (``group_labels``)."""
    segment = "" if by is None else f" [{shown_name(group_label(report.segment, by))}]"
    # Titles and cells are rich markup: unescaped, "[gpt-4.1]" would be read as a style tag and vanish.
    note = report.no_step_note()
    table = Table(
        title=escape(f"funnel {shown_name(report.workflow)}{segment}: {report.sessions} sessions"),
        caption=escape(note) if note is not None else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    widest = max((len(s.step) for s in report.steps), default=4)
    table.add_column("step", no_wrap=True, min_width=min(widest, 24))
    for column in ("reach", "of all", "of prev", "dropped", "live", "done", "p50/p95 s"):
        wraps = column == "dropped"
        table.add_column(
            column, justify="left" if wraps else "right", no_wrap=not wraps, min_width=12 if wraps else None
        )
    for s in report.steps:
        drops = s.drops()
        dropped = ", ".join(f"{c} {n}" if e is None else f"{c}:{e} {n}" for c, e, n in drops) or "-"
        table.add_row(
            escape(shown_name(s.step)),
            str(s.reached),
            f"{s.overall_conversion:.1%}",
            f"{s.step_conversion:.1%}",
            escape(dropped),
            str(s.in_progress),
            str(s.completed),
            f"{_seconds(s.p50_seconds)}/{_seconds(s.p95_seconds)}",
        )
    return whole_cells(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


ExactOption = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Read the raw rows (exact percentiles) even for windows of 25 h or more, which read roll-ups.",
    ),
]


def dashboard_command(
    since: Annotated[str, typer.Option(help="Window: 30m, 24h, 7d ...")] = "24h",
    by: Annotated[list[str] | None, typer.Option(help=BY_HELP)] = None,
    reprice_as: Annotated[str | None, typer.Option(help=REPRICE_HELP)] = None,
    tenant: TenantOption = None,
    exact: ExactOption = False,
    tiers: Annotated[bool, typer.Option("--tiers", help=TIERS_HELP)] = False,
) -> None:
    """Calls, errors, tokens, cost and latency percentiles of one tenant's model calls, grouped."""
    groups = by or ["model"]
    with reported_errors(), Engine() as engine:
        whose = _tenant(engine, tenant)
        # From the engine's clock (the database's), which stamped the calls: from this host's,
        # 10 minutes ahead of it, "--since 5m" left out the calls just made.
        start = engine.clock() - parse_since(since)
        if reprice_as is not None:  # refused before anything is printed
            table = load_price_table(engine.settings.pricing_file)
            now = datetime.now(UTC)
            prices = table.in_force(now)  # not an entry that takes effect later
            as_key = table.key_in_force(reprice_as, now)
            if as_key is None:
                raise ValidationError("reprice_as", f"no price for {reprice_as!r} in {table.version}")
        projector = projector_for(engine).ready_to_read()
        with projector.report() as conn:
            read = read_for(parse_since(since), exact=exact)  # judged on the engine's clock
            rows = dashboard(conn, projector.names.reader, tenant=whose, since=start, by=groups, read=read)
            console.print(dashboard_table(rows, groups, f"model calls, last {since}"))
            if reprice_as is not None:
                repriced = reprice(
                    conn,
                    projector.names.reader,
                    prices,
                    tenant=whose,
                    as_model=as_key,
                    since=start,
                    by=groups,
                )
                out = Table(title=escape(f"same usage at {reprice_as} prices ({table.version})"))
                # "calls" counted the unpriced calls, which are neither in "recorded $" nor repriced
                heads = [
                    *groups,
                    "priced calls",
                    "not priced",
                    "recorded $",
                    f"{reprice_as} $",
                    "difference $",
                ]
                for column in heads:
                    out.add_column(escape(column), justify="left" if column in groups else "right")
                for r in repriced:
                    out.add_row(
                        *_group_cells(r.group, groups),  # as the dashboard's
                        str(r.priced_calls),
                        str(r.calls - r.priced_calls),
                        money(r.recorded_cost_usd, 6),
                        money(r.repriced_cost_usd, 6),
                        money(r.difference_usd, 6, sign=True),
                    )
                console.print(out)
            if tiers:
                policies, baseline = tier_policies(engine.classifier.tiers)
                report = reprice_by_tier(
                    conn,
                    projector.names.reader,
                    load_price_table(engine.settings.pricing_file),
                    policies,
                    tenant=whose,
                    since=start,
                    baseline=baseline,
                    as_made=CONFIGURED,  # as REST's what-if: at the models that made the calls
                )
                console.print(tiers_table(report, since))


def funnel_command(
    workflow: Annotated[str, typer.Argument(help="The workflow name.")],
    by: Annotated[str | None, typer.Option(help="Break down by 'model' or 'metadata.<key>'.")] = None,
    steps: Annotated[str | None, typer.Option(help=STEPS_HELP)] = None,
    step: Annotated[list[str] | None, typer.Option(help=STEP_HELP)] = None,
    since: Annotated[
        str | None, typer.Option(help="Only sessions started in this window: 30m, 24h, 7d ...")
    ] = None,
    tenant: TenantOption = None,
    exact: ExactOption = False,
) -> None:
    """Per step of one tenant's sessions: reaching it, conversion, drop-off by cause, time to reach it."""
    with reported_errors():
        require_name("workflow", workflow)
        window = None if since is None else parse_since(since)
        if steps is not None and step:
            raise ValidationError("steps", "give --steps or --step, not both")
        # A --step is one name as written: --steps splits at commas and strips, so a step named
        # "a,b" or "  padded  " (names may hold both) could not be put in the order at all.
        order = list(step) if step else [s.strip() for s in steps.split(",")] if steps else None
        if steps and order is not None and "" in order:
            raise ValidationError(
                "steps", f"a step name is empty in {steps!r}: name the steps, comma-separated"
            )
        with Engine() as engine:
            whose = _tenant(engine, tenant)
            start = None if window is None else engine.clock() - window  # the calls' clock
            projector = projector_for(engine).ready_to_read()
            with projector.report() as conn:
                reader = projector.names.reader
                reports = funnel_report(
                    conn,
                    reader,
                    workflow,
                    tenant=whose,
                    steps=order,
                    by=by,
                    since=start,
                    read=read_for(window, exact=exact),
                )
        if not reports:
            started = "" if since is None else f" started in the last {since}"
            console.print(f"no sessions of workflow {workflow!r}{started}", markup=False)
        for report in reports:
            console.print(funnel_table(report, by))


def show_analytics(engine: Engine, out: Console, *, since: timedelta = timedelta(days=1)) -> None:
    """Catch the projections up (with a progress bar) and print the engine tenant's dashboard
    and the funnel of every workflow, both of the sessions and calls of the last ``since``."""
    projector = projector_for(engine, batch_size=5000)
    with progress_bar(projector, "projecting") as advance:
        projector.catch_up(progress=advance)
    start = engine.clock() - since
    reader, tenant = projector.names.reader, engine.tenant
    with projector.connect() as conn:
        for groups in (["model"], ["workflow", "step"]):
            rows = dashboard(conn, reader, tenant=tenant, since=start, by=groups, read=read_for(since))
            out.print(dashboard_table(rows, groups, f"model calls by {', '.join(groups)}"))
        for workflow in workflows(conn, reader, tenant=tenant, since=start):
            # The dashboard's window: without it each funnel counted every session ever started.
            reports = funnel_report(conn, reader, workflow, tenant=tenant, since=start, read=read_for(since))
            for report in reports:
                out.print(funnel_table(report))


def register(app: typer.Typer) -> None:
    """Add ``projections``, ``dashboard`` and ``funnel`` to the top-level app."""
    app.add_typer(projections_app, name="projections")
    app.command("dashboard")(dashboard_command)
    app.command("funnel")(funnel_command)
