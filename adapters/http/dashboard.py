"""The dashboard page (``/dashboard``) and its data as JSON (``/v1/dashboard``, ``/v1/funnel``).

Each request first catches the projections up with the log, so the page is current
even when no ``projections follow`` process runs. The JSON needs a reader key; the page
takes one too, or the cookie its login form sets (``login.py``).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Security
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials
from psycopg import sql
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.durations import parse_since
from flowledger.adapters.group_labels import group_label
from flowledger.adapters.http.analytics_schemas import DashboardRowOut, FunnelReportOut
from flowledger.adapters.http.auth import Caller, Gate, Reader, api_key_header, bearer, session_of, token_of
from flowledger.adapters.http.budget_panel import budget_panel
from flowledger.adapters.http.charts import bar_chart, column_chart, fitted, isolated, name_cell
from flowledger.adapters.http.errors import ERROR_CONTENT, responses, worded
from flowledger.adapters.http.headers import page_policy
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.login import LOGIN_FORM, login_page, refused_login
from flowledger.adapters.http.page_text import escape
from flowledger.adapters.http.pages import ICON
from flowledger.adapters.http.schemas import ANY_TEXT, PathId
from flowledger.adapters.http.served_prices import served_prices
from flowledger.adapters.http.task_schemas import TierReportOut, answers
from flowledger.adapters.http.tier_panel import tier_panel, tier_report
from flowledger.adapters.http.timeline import Timeline, bucket_for, timeline
from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import EXACT
from flowledger.domain.values import exact_decimal
from flowledger.infrastructure import Engine
from flowledger.infrastructure.history import jsonable
from flowledger.projections import (
    DashboardRow,
    FunnelReport,
    FunnelStep,
    Projector,
    RepriceRow,
    dashboard,
    funnel_report,
    projector_for,
    reprice,
)
from flowledger.projections.cost_queries import GROUPINGS, RAW_WINDOW, read_for

router = APIRouter(route_class=OneNameRoute, tags=["analytics"])
# One to five digits, not all zeros: the pattern says exactly what ``parse_since`` takes, so a
# value the API document allows is never refused by the handler (schemathesis checks that).
_AMOUNT = r"(?:[1-9][0-9]{0,4}|0[1-9][0-9]{0,3}|00[1-9][0-9]{0,2}|000[1-9][0-9]?|0000[1-9])"
_WINDOW = worded(
    rf"^\s*{_AMOUNT}[smhdw]\s*$",
    # The digits are said: "365000d" was told only that a window must be above zero.
    "must be a window above zero of 1 to 5 digits and a unit (s, m, h, d or w), like 30m, 24h or 7d",
)
Since = Annotated[
    str,
    Query(description="A window like 30m, 24h or 7d.", max_length=20, pattern=_WINDOW),
]
_PAGE = (Path(__file__).parent / "dashboard.html").read_text(encoding="utf-8")
_POLICY = page_policy(_PAGE)
_PLACEHOLDER = re.compile(r"\{\{(icon|since|body)\}\}")
_ANALYTICS = responses(400)
Grouping = Annotated[
    str,
    Field(
        pattern=worded(
            "^(" + "|".join(sorted(GROUPINGS)) + ")$", f"must be one of {', '.join(sorted(GROUPINGS))}"
        )
    ),
]
Exact = Annotated[
    bool,
    Query(
        description="true: read the raw rows (exact percentiles) even for windows of 25 h or more"
        " (true or false: any other spelling is a 422)."
    ),
]


def _start(engine: Engine, since: str, end: datetime | None = None) -> datetime:
    """The window's start, ``since`` before ``end`` (default: now by the engine's clock, the
    database server's, which stamped the calls: measured from this host's clock, 10 minutes
    ahead of the database's, ``since=5m`` left out the calls just made); a window reaching
    before year 1 is refused, not a 500 from OverflowError."""
    try:
        return (engine.clock() if end is None else end) - parse_since(since)
    except OverflowError:
        raise ValidationError("since", f"{since!r} reaches too far back") from None


def _projector(engine: Engine) -> Projector:
    # With FLOWLEDGER_READ_DATABASE_URL the read models are read on the replica, uncaught-up.
    return projector_for(engine).ready_to_read()  # ValidationError for an in-memory engine


@router.get("/v1/dashboard", response_model=None, responses={**answers(list[DashboardRowOut]), **_ANALYTICS})
def dashboard_json(
    caller: Reader,
    since: Since = "24h",
    by: Annotated[list[Grouping], Query(max_length=8)] = ["model"],  # noqa: B006 - FastAPI copies the default
    exact: Exact = False,
    reprice_as: Annotated[
        str | None,
        Query(
            description="Also price each group's recorded tokens at this model's price (the CLI's "
            "--reprice-as): adds reprice_as, priced_calls, repriced_cost_usd and difference_usd.",
            max_length=200,
        ),
    ] = None,
) -> list[dict[str, Any]]:
    """Calls, errors, tokens, cost and latency percentiles per group: exact for windows up to a
    day or with ``exact``, else from roll-ups (within 2 %); with ``reprice_as``, what the same
    usage would have cost at that model's prices (422 for a model with no price)."""
    start = _start(caller.engine, since)
    prices = None if reprice_as is None else served_prices(caller.engine)
    now = datetime.now(UTC)
    in_force = None if prices is None else prices.in_force(now)  # no entry of the future
    as_key = None if prices is None or reprice_as is None else prices.key_in_force(reprice_as, now)
    if prices is not None and as_key is None:
        raise ValidationError("reprice_as", f"no price for {reprice_as!r} in {prices.version}")
    projector = _projector(caller.engine)
    reader = projector.names.reader
    with projector.report() as conn:
        read = read_for(parse_since(since), exact=exact)
        rows = dashboard(conn, reader, tenant=caller.tenant, since=start, by=by, read=read)
        if in_force is None or reprice_as is None or as_key is None:
            return [jsonable(asdict(row)) for row in rows]
        repriced = {
            r.group: r
            for r in reprice(
                conn, reader, in_force, tenant=caller.tenant, as_model=as_key, since=start, by=by
            )
        }
    return [_with_reprice(row, reprice_as, repriced[row.group]) for row in rows]


def _with_reprice(row: DashboardRow, model: str, repriced: RepriceRow) -> dict[str, Any]:
    both: dict[str, Any] = jsonable(
        {
            **asdict(row),
            "reprice_as": model,
            "priced_calls": repriced.priced_calls,
            # What difference_usd is taken from: the priced calls' answers, whose tokens are
            # what is repriced; cost_usd beside it counts retried attempts and unpriced models.
            "recorded_cost_usd": repriced.recorded_cost_usd,
            "repriced_cost_usd": repriced.repriced_cost_usd,
            "difference_usd": repriced.difference_usd,
        }
    )
    return both


# Any text: a workflow's name may hold '/', which the server decodes before routing (``%2F``)
# and clients may leave unescaped; it was a 404, an unknown path.
@router.get(
    f"/v1/funnel/{{workflow:{ANY_TEXT}}}",
    response_model=None,
    responses={**answers(list[FunnelReportOut]), **_ANALYTICS},
)
def funnel_json(
    workflow: Annotated[str, PathId], caller: Reader, since: Since = "7d", exact: Exact = False
) -> list[dict[str, Any]]:
    """The completion funnel of a workflow: reach, conversion, drop-off by cause, time to reach
    (from roll-ups for windows of 25 h or more, unless ``exact``)."""
    start = _start(caller.engine, since)
    projector = _projector(caller.engine)
    with projector.report() as conn:
        reader, read = projector.names.reader, read_for(parse_since(since), exact=exact)
        reports = funnel_report(conn, reader, workflow, tenant=caller.tenant, since=start, read=read)
    return [jsonable(asdict(report)) for report in reports]


_PAGE_ERROR: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "An invalid window (or no PostgreSQL): the page, saying why; a query"
        " parameter the page does not take: the error envelope, as everywhere",
        "content": {"text/html": {}, **ERROR_CONTENT},
    }
}


@router.get("/dashboard", response_class=HTMLResponse, responses={**_ANALYTICS, **LOGIN_FORM, **_PAGE_ERROR})
async def dashboard_page(
    request: Request,
    # Declared for the document's security schemes; ``token_of`` reads the headers itself.
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    _header_key: Annotated[str | None, Security(api_key_header)],
    # Checked here, not by FastAPI: a person who typed a bad window gets the page saying so.
    since: Annotated[
        str, Query(description="A window like 30m, 24h or 7d.", json_schema_extra={"pattern": _WINDOW})
    ] = "24h",
    # Declared, so that it is not an unknown parameter (query.py), but not advertised: a key
    # in a URL ends up in history and logs, and the page takes it only when enabled.
    key: Annotated[str | None, Query(include_in_schema=False)] = None,
) -> HTMLResponse:
    """Cost, latency, traffic and funnels as pictures; without a key, the login form (401);
    an invalid window, the page with the error (422)."""
    gate: Gate = request.app.state.gate
    try:
        token = token_of(request)
        if token is None and key and gate.tenants.base.settings.dashboard_url_keys:
            token = key
        signed_in = session_of(request) if token is None else None
    except HTTPException as conflict:  # two different keys or sign-ins: the 401 is the login form
        return login_page(str(conflict.detail))
    try:
        caller = await gate.admit(request, token or signed_in, "reader", session=signed_in is not None)
    except HTTPException as refused:
        return refused_login(refused, token)
    try:
        page: HTMLResponse = await run_in_threadpool(_render, caller, since)
    except ValidationError as invalid:
        return _page(f'<p class="error" role="alert">{escape(str(invalid))}</p>', since, status=422)
    finally:
        gate.release(caller)
    return page


def _page(body: str, since: str, *, status: int = 200) -> HTMLResponse:
    # One pass: filled one after another, a window typed as "{{body}}" was filled with the body.
    parts = {"icon": ICON, "since": escape(since), "body": body}
    return HTMLResponse(
        _PLACEHOLDER.sub(lambda found: parts[found[1]], _PAGE),
        status_code=status,
        headers={"Content-Security-Policy": _POLICY},
    )


def _render(caller: Caller, since: str) -> HTMLResponse:
    end = caller.engine.clock()  # the calls' clock: the traffic chart's last column is its minute
    start = _start(caller.engine, since, end)
    bucket = bucket_for(end - start)
    # Decided here, from the window, rather than by ``dashboard``'s "auto" (from the host's
    # clock): the latency chart says which it read.
    exact = end - start < RAW_WINDOW
    read = "raw" if exact else "rollups"
    projector = _projector(caller.engine)
    reader, tenant = projector.names.reader, caller.tenant
    with projector.report() as conn:
        by_model = dashboard(conn, reader, tenant=tenant, since=start, by=["model"], read=read)
        by_time = dashboard(conn, reader, tenant=tenant, since=start, by=[bucket], read=read)
        workflows = [
            w
            for (w,) in conn.execute(
                sql.SQL(
                    "SELECT DISTINCT workflow FROM {}.funnel_sessions "
                    "WHERE tenant = %s AND started_at >= %s ORDER BY 1"
                ).format(sql.Identifier(reader)),
                [tenant, start],
            ).fetchall()
        ]
        funnels = [
            r
            for w in workflows
            for r in funnel_report(conn, reader, w, tenant=tenant, since=start, read=read_for(end - start))
        ]
        tiers = tier_report(caller.engine, conn, reader, tenant=tenant, since=start)
    calls = {row.group[0]: float(row.calls) for row in by_time}
    if bucket == "day":  # a long window starts at its first day with calls (none: today)
        start = max(start, min(calls, default=end))
    body = "".join(
        [
            _summary(by_model, since),
            budget_panel(caller.engine.budgets.burn()),
            tier_panel(tiers),
            '<section class="grid">',
            _cost_chart(by_model),
            _cost_split_chart(by_model),
            _latency_chart(by_model, exact=exact),
            _traffic_chart(timeline(calls, bucket, start, end)),
            _errors(by_model),
            "</section>",
            *(_funnel(report) for report in funnels),
        ]
    )
    return _page(body, since)


def _exact_money(amount: Decimal) -> str:
    """An amount as the tiles and the cost charts write it: 4 decimals (2 from $100 on) and
    every further one it has. Through ``float`` at 4 places, a day of cheap calls that cost
    $0.00004 read $0.0000, and a model's $0.00045 read $0.0004 beside its bar (the float
    nearest it is below it)."""
    return "$" + exact_decimal(amount, 4 if amount < 100 else 2, grouping=True)


def _summary(rows: list[DashboardRow], since: str) -> str:
    calls = sum(r.calls for r in rows)
    errors = sum(r.errors for r in rows)
    with localcontext(EXACT):  # the tiles show every decimal: none rounded away at 28 digits
        cost = sum((r.cost_usd for r in rows), Decimal("0"))
        wasted = sum((r.retried_cost_usd + r.failed_cost_usd for r in rows), Decimal("0"))
    tokens = sum(r.input_tokens + r.output_tokens for r in rows)
    unpriced = sum(r.unpriced_calls for r in rows)
    tiles = [
        ("model calls", f"{calls:,}"),
        ("cost" + (" (without unpriced calls)" if unpriced else ""), _exact_money(cost)),
        ("of it failed and retried attempts", _exact_money(wasted)),
        ("tokens", f"{tokens:,}"),
        ("error rate", f"{errors / calls:.1%}" if calls else "-"),
    ]
    if unpriced:
        tiles.append(
            ("unpriced calls: no price known, not $0", f'<span class="unpriced">{unpriced:,}</span>')
        )
    cells = "".join(f'<div class="tile"><b>{value}</b><span>{label}</span></div>' for label, value in tiles)
    return f'<h2>last {escape(since)}</h2><section class="tiles">{cells}</section>'


def _label(row: DashboardRow) -> str:
    """The model, cut to fit as the chart cuts a label (the chart, given whole labels, cuts none:
    a long priced name ran off the cost charts' left edge), marked when some of its calls had no
    price (their cost is not counted)."""
    name = _model(row)
    if not row.unpriced_calls:
        return fitted(name)
    # Isolated when text follows: an override in the name (U+202E) turned "(unpriced: 1)" around;
    # the name cut as the chart cuts a label, the mark kept after it.
    return f"{isolated(fitted(name))} (unpriced: {row.unpriced_calls:,})"


def _model(row: DashboardRow) -> str:
    """The row's model as the page writes it: calls with no model ``(no model)``, and a model
    named so ``"(no model)"`` (``group_labels``)."""
    return group_label(row.group[0], "model")


def _cost_chart(rows: list[DashboardRow]) -> str:
    labels = [_label(r) for r in rows]
    costs = {"cost": [r.cost_usd for r in rows]}
    return bar_chart("cost by model (USD)", labels, costs, _exact_money, whole=[_model(r) for r in rows])


def _cost_split_chart(rows: list[DashboardRow]) -> str:
    labels = [_label(r) for r in rows]
    series = {
        "successful steps": [r.succeeded_cost_usd for r in rows],
        "retried attempts": [r.retried_cost_usd for r in rows],
        "failed calls": [r.failed_cost_usd for r in rows],
    }
    title = "cost of successful steps vs failed and retried attempts (USD)"
    return bar_chart(title, labels, series, _exact_money, whole=[_model(r) for r in rows])


def _latency_chart(rows: list[DashboardRow], *, exact: bool) -> str:
    """p50/p95/p99 per model; ``exact`` when they were read from the raw rows, else the title
    says they are the roll-ups' (within 2 %): a week's chart said "exact percentiles"."""
    # Calls that recorded no latency (failed before any request) have no bars, not 0 ms ones.
    timed = [r for r in rows if r.latency_p50_ms is not None]
    labels = [_model(r) for r in timed]
    series = {name: [getattr(r, f"latency_{name}_ms") for r in timed] for name in ("p50", "p95", "p99")}
    which = "exact percentiles" if exact else "percentiles within 2 %: roll-ups"
    return bar_chart(f"latency by model (ms, {which})", labels, series, lambda v: f"{v:,.0f} ms")


def _traffic_chart(line: Timeline) -> str:
    return column_chart(
        f"model calls per {line.bucket} (UTC)",
        line.labels,
        line.values,
        lambda v: f"{v:,.0f}",
        x_axis=f"time (UTC), one column per {line.bucket}",
        y_axis="calls",
    )


def _errors(rows: list[DashboardRow]) -> str:
    lines = [
        f"<tr>{name_cell(_model(r))}{name_cell(kind)}<td>{count:,}</td></tr>"
        for r in rows
        for kind, count in sorted(r.errors_by_type.items())
    ]
    table = "".join(lines) or '<tr><td colspan="3">no failed calls</td></tr>'
    return (
        '<div class="panel"><h3>errors by type</h3><table><tr><th>model</th><th>error</th>'
        f"<th>calls</th></tr>{table}</table></div>"
    )


def _funnel(report: FunnelReport) -> str:
    labels = [step.step for step in report.steps]
    chart = bar_chart(
        f"funnel: {isolated(report.workflow)} ({report.sessions:,} sessions)",
        labels,
        {"reached": [float(s.reached) for s in report.steps]},
        lambda v: f"{v:,.0f}",
    )
    rows = "".join(
        f"<tr>{name_cell(s.step)}<td>{s.reached:,}</td><td>{s.overall_conversion:.1%}</td>"
        f"<td>{s.step_conversion:.1%}</td>{_causes(s)}<td>{s.in_progress:,}</td>"
        f"<td>{_seconds(s.p50_seconds)}</td><td>{_seconds(s.p95_seconds)}</td></tr>"
        for s in report.steps
    )
    note = report.no_step_note()
    below = f"<p>{escape(note)}</p>" if note is not None else ""
    return (
        f'<section class="grid funnel"><div class="panel">{chart}</div><div class="panel"><table>'
        "<tr><th>step</th><th>reached</th><th>overall</th><th>from previous</th><th>dropped</th>"
        f"<th>in progress</th><th>p50 to reach</th><th>p95</th></tr>{rows}</table>{below}</div></section>"
    )


_CAUSE_CHARS = 12
"""The characters of an error type the drop-off cell shows (the rest on hover): with names of
200 characters at 1280 pixels, 16 pushed the funnel's figures out of view (and did 7 beside a
chart of at least 280 pixels, now 200; ``test_at_1280_pixels_names_of_200_characters_...``)."""


def _causes(step: FunnelStep) -> str:
    """The drop-off cell of ``step``: why sessions stopped there, failures by error type as the
    CLI writes them (``failed:RateLimited 1``; the page wrote ``failed 1``), escaped. A type is
    isolated from its count (an override in it turned the count around) and cut as a chart label
    is (a 200-character one pushed the funnel's figures out of view), whole on hover."""
    drops = step.drops()
    if not drops:
        return "<td>-</td>"

    def written(cut: bool) -> str:
        return ", ".join(
            f"{cause} {n}"
            if error is None
            else f"{cause}:{isolated(fitted(error, _CAUSE_CHARS) if cut else error)} {n}"
            for cause, error, n in drops
        )

    return f'<td title="{escape(written(cut=False))}">{escape(written(cut=True))}</td>'


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} s"


@router.get("/v1/dashboard/tiers", response_model=None, responses={**answers(TierReportOut), **_ANALYTICS})
def tiers_json(caller: Reader, since: Since = "24h") -> dict[str, Any]:
    """The task calls recorded in the window, priced as if each model-tier policy had routed
    them: the configured tiers, and every priority on one of their models. Savings are
    measured against the configured premium model alone (the seed's "mixed saves 73 %")."""
    start = _start(caller.engine, since)
    projector = _projector(caller.engine)
    with projector.report() as conn:
        report = tier_report(caller.engine, conn, projector.names.reader, tenant=caller.tenant, since=start)
    result: dict[str, Any] = jsonable(asdict(report))
    return result
