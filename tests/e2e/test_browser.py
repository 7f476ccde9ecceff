"""The pages in a real browser (headless Chromium, no network beyond loopback): the dashboard
and the API documentation, as a person opens them. A screenshot of the dashboard is kept
under ``.venv/test-artifacts/`` (``tests/support/browser.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.live_http import ACME_READER, KEYS, live_server
from tests.support.browser import console_lines, dom_after_scripts, screenshot

# A page of the test's own, served beside the dashboard (same origin): it loads the dashboard
# in a 760-pixel frame, then writes into its own DOM every table cell whose text takes more
# than one line, so that ``--dump-dom`` carries what the layout did.
MEASURE = """<!doctype html><html><body>
<iframe id="page" src="/dashboard?since=1h" style="width:760px;height:2400px;border:0"></iframe>
<pre id="out">pending</pre>
<script>
document.getElementById("page").addEventListener("load", () => {
  const doc = document.getElementById("page").contentDocument;
  const cells = [...doc.querySelectorAll("td, th")];
  const wrapped = cells.filter((cell) => {
    const range = doc.createRange();
    range.selectNodeContents(cell);
    return range.getClientRects().length > 1;
  }).map((cell) => cell.textContent);
  document.getElementById("out").textContent = JSON.stringify({cells: cells.length, wrapped});
});
</script></body></html>"""


# Loads the dashboard in a frame as wide as ``?width=`` says, then writes into its own DOM how
# wide the page became and every box whose content is wider than the box (clipped, or
# scrolled inside it: said with its overflow-x), so that ``--dump-dom`` carries the layout.
FIT = """<!doctype html><html><body style="margin:0">
<iframe id="page" style="height:2400px;border:0"></iframe>
<pre id="out">pending</pre>
<script>
const frame = document.getElementById("page");
frame.style.width = new URLSearchParams(location.search).get("width") + "px";
frame.addEventListener("load", () => {
  const doc = frame.contentDocument;
  const boxes = [...doc.querySelectorAll(".panel, .grid > *, .tiles")];
  const overflowing = boxes.filter((box) => box.scrollWidth > box.clientWidth + 1).map((box) => ({
    text: box.textContent.slice(0, 40),
    overflowX: getComputedStyle(box).overflowX,
    tables: box.querySelectorAll("table").length,
  }));
  document.getElementById("out").textContent = JSON.stringify({
    page: doc.documentElement.scrollWidth, boxes: boxes.length, overflowing,
  });
});
frame.src = "/dashboard?since=1h";
</script></body></html>"""


# Loads the dashboard in a frame, then writes into its own DOM every chart text that runs past
# its chart's right edge (the viewBox clips it), so that ``--dump-dom`` carries what was cut.
CLIPPED = """<!doctype html><html><body>
<iframe id="page" src="/dashboard?since=1h" style="width:1280px;height:2400px;border:0"></iframe>
<pre id="out">pending</pre>
<script>
document.getElementById("page").addEventListener("load", () => {
  const doc = document.getElementById("page").contentDocument;
  const charts = [...doc.querySelectorAll("svg.chart")];
  const cut = charts.flatMap((svg) => [...svg.querySelectorAll("text.value")].filter((text) => {
    const box = text.getBBox();
    return box.x + box.width > svg.viewBox.baseVal.width + 0.5;
  }).map((text) => text.textContent));
  document.getElementById("out").textContent = JSON.stringify({charts: charts.length, cut});
});
</script></body></html>"""


def usage(model: str, cost: str, latency: float) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=1200,
        output_tokens=80,
        cost_usd=Decimal(cost),
        latency_ms=latency,
    )


@pytest.fixture
def site(pg_engine: Engine) -> Iterator[str]:
    """The app on a real port, over sessions with calls, a failed call and a funnel."""
    for n in range(6):
        session_id = f"b-{n}"
        pg_engine.start_session(session_id, "customer_service", metadata={"channel": "web"})
        pg_engine.record_step(
            session_id, "greet", next_step="classify_intent", usage=usage("gpt-4.1", "0.0030", 420.0)
        )
        if n % 2:
            pg_engine.record_step(
                session_id,
                "classify_intent",
                next_step="resolve",
                usage=usage("deepseek-v3.2", "0.0002", 60.0),
            )
    failed = usage("claude-sonnet-4.5", "0", 0.0)
    pg_engine.store.write(
        "b-0",
        lambda uow: uow.find(pg_engine.session_uuid("b-0")).fail_step(
            step="classify_intent", error_type="circuit_open", error_message="circuit open", usage=failed
        ),
    )
    app = create_app(pg_engine)
    app.add_api_route("/__measure", lambda: HTMLResponse(MEASURE), include_in_schema=False)
    app.add_api_route("/__fit", lambda: HTMLResponse(FIT), include_in_schema=False)
    app.add_api_route("/__clipped", lambda: HTMLResponse(CLIPPED), include_in_schema=False)
    with live_server(app) as base_url:
        yield base_url


def test_the_dashboard_in_a_browser_shows_models_bucketed_time_and_unwrapped_tables(site: str) -> None:
    # When the dashboard of the last hour is opened
    dom = dom_after_scripts(f"{site}/dashboard?since=1h")
    # Then the failed call is under its model, and the traffic chart is per minute with named axes
    failed = '<td class="name" title="claude-sonnet-4.5">claude-sonnet-4.5</td>'
    assert f'{failed}<td class="name" title="circuit_open">circuit_open</td>' in dom, dom[-3000:]
    assert "(none)" not in dom
    # And the funnel names the error type of the session that failed at classify_intent
    cause = "failed:\u2068circuit_open\u2069 1"
    assert f'<td title="{cause}">{cause}</td>' in dom
    assert "model calls per minute (UTC)" in dom
    assert "time (UTC), one column per minute" in dom
    assert ">calls</text>" in dom
    assert "funnel: \u2068customer_service\u2069" in dom  # the name isolated (charts.isolated)
    # And in a narrow frame, no table cell's text breaks over two lines
    measured = re.search(r'<pre id="out">(.*?)</pre>', dom_after_scripts(f"{site}/__measure"), re.DOTALL)
    assert measured is not None
    layout = json.loads(measured.group(1))
    assert layout["cells"] > 20
    assert layout["wrapped"] == []
    # And a screenshot is kept for a person to look at
    shot = screenshot(f"{site}/dashboard?since=1h", "dashboard.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000


def _fit(site: str, width: int) -> dict[str, Any]:
    measured = re.search(
        r'<pre id="out">(.*?)</pre>', dom_after_scripts(f"{site}/__fit?width={width}"), re.DOTALL
    )
    assert measured is not None
    layout: dict[str, Any] = json.loads(measured.group(1))
    assert layout["boxes"] > 5, layout
    return layout


def test_at_1280_pixels_every_panel_the_funnel_table_included_fits_its_box(site: str) -> None:
    # (The funnel's table was cut at "p9" in a 1280 x 900 window: its column took 3/5 of the row.)
    layout = _fit(site, 1280)
    assert layout["page"] <= 1280, layout
    assert layout["overflowing"] == [], layout
    shot = screenshot(f"{site}/dashboard?since=1h", "dashboard-1280.png", width=1280, height=900)
    assert shot.stat().st_size > 20_000


def test_in_a_narrow_window_a_table_too_wide_scrolls_inside_its_own_box(site: str) -> None:
    layout = _fit(site, 640)
    # The page itself never scrolls sideways: what does not fit scrolls in its panel
    assert layout["page"] <= 640, layout
    assert layout["overflowing"], layout  # at 640 pixels the funnel's table does not fit
    for box in layout["overflowing"]:
        assert box["overflowX"] == "auto", layout


def test_an_invalid_window_in_the_address_shows_the_error_on_the_page(site: str) -> None:
    dom = dom_after_scripts(f"{site}/dashboard?since=bogus")
    alert = re.search(r'<p class="error" role="alert">(.*?)</p>', dom)
    assert alert is not None
    assert "bogus" in alert.group(1)
    assert "<h1>flowledger</h1>" in dom


@pytest.mark.parametrize(
    ("page", "drawn"),
    [
        ("/docs", ['data-path="/v1/sessions"', 'data-path="/v1/dashboard"']),
        ("/redoc", ["/webhook/workflow-state", "API docs by Redocly"]),
    ],
)
def test_the_api_documents_run_under_their_policy_and_ask_for_nothing_it_refuses(
    site: str, page: str, drawn: list[str]
) -> None:
    # (/docs and /redoc had no Content-Security-Policy, and ReDoc fetched its logo from a CDN.)
    # When the page is opened with every host but loopback unreachable
    lines = console_lines(f"{site}{page}", budget_ms=15000)
    dom = dom_after_scripts(f"{site}{page}", budget_ms=15000)
    # Then its scripts ran under the policy and drew the API
    for text in drawn:
        assert text in dom, (page, text)
    # And the browser refused nothing and reported no error: no request to the CDN either
    assert [line for line in lines if "Content Security Policy" in line or "cdn." in line] == [], lines
    assert "cdn.redoc.ly" not in dom


def test_swagger_ui_renders_the_api_with_no_network(site: str) -> None:
    # When /docs is opened with every host but loopback unreachable
    dom = dom_after_scripts(f"{site}/docs", budget_ms=15000)
    # Then Swagger UI ran (its script and styles came from the app) and drew the operations
    for path in ("/webhook/workflow-state", "/v1/sessions", "/v1/dashboard"):
        assert f'data-path="{path}"' in dom


class Answered:
    """The app, noting the path and status of every response it gives."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, noted)


def test_the_signed_in_dashboard_loads_with_no_failed_request_in_the_browser(
    database_url: str, pg_schema: str
) -> None:
    # Given a server that needs keys (the page takes one in its address here), over a recorded call
    settings = make_settings(
        database_url=database_url, schema=pg_schema, tenant="acme", api_keys=KEYS, dashboard_url_keys=True
    )
    with Engine(settings=settings) as engine:
        engine.start_session("k-1", "customer_service")
        engine.record_step(
            "k-1", "greet", next_step="classify_intent", usage=usage("gpt-4.1", "0.0030", 420.0)
        )
        app = Answered(create_app(engine, require_keys=True))
        with live_server(app) as base_url:  # type: ignore[arg-type]
            # When a browser opens the page with a reader's key
            dom = dom_after_scripts(f"{base_url}/dashboard?key={ACME_READER}")
    # Then it shows the data
    assert "<title>flowledger dashboard</title>" in dom
    assert "gpt-4.1" in dom
    # And nothing it asked for failed, which the browser's console would show as an error (its
    # own request for /favicon.ico was a 404 on every page: the page names no icon)
    assert app.seen, "the server saw no request"
    assert [(path, status) for path, status in app.seen if status >= 400] == []


def test_in_a_narrow_window_a_cost_of_many_decimals_wraps_in_its_tile(site: str, pg_engine: Engine) -> None:
    # Given a call whose retried attempts cost 1E-40 (a tile shows every decimal: 42 characters)
    pg_engine.start_session("b-precise", "customer_service")
    precise = LlmUsage(
        provider="test",
        request_model="gpt-4.1",
        input_tokens=10,
        output_tokens=1,
        cost_usd=Decimal("123456789.1234567890123456789012345678901234567891"),
        retried_cost_usd=Decimal("1E-40"),
        latency_ms=5.0,
    )
    pg_engine.record_step("b-precise", "greet", usage=precise)
    # When the page is drawn 640 pixels wide
    layout = _fit(site, 640)
    # Then the page does not scroll sideways (the tiles' numbers pushed it to 692 pixels)
    assert layout["page"] <= 640, layout
    assert not [box for box in layout["overflowing"] if box["tables"] == 0], layout


def test_a_large_cost_is_drawn_whole_beside_its_bar(site: str, pg_engine: Engine) -> None:
    # Given two calls of a model that cost $999,999,999 each (a call may cost up to $10^9)
    pg_engine.start_session("b-large", "customer_service")
    for step in ("greet", "classify_intent"):
        pg_engine.record_step("b-large", step, usage=usage("gpt-4.1", "999999999", 5.0))
    # When the dashboard is drawn
    measured = re.search(r'<pre id="out">(.*?)</pre>', dom_after_scripts(f"{site}/__clipped"), re.DOTALL)
    assert measured is not None
    layout = json.loads(measured.group(1))
    # Then every figure beside a bar is whole: "$1,999,999,998.02" lost its last characters past
    # the chart's right edge, which held 90 px for the figure after the longest bar
    assert layout["charts"] >= 4, layout
    assert layout["cut"] == [], layout


def test_at_1280_pixels_names_of_200_characters_leave_every_tables_figures_in_view(
    site: str, pg_engine: Engine
) -> None:
    # Given a failed call whose model and error type, and a session whose workflow and steps,
    # have names of 200 characters (the longest a name may be)
    model, error, step = "m" * 199 + "!", "e" * 199 + "!", "s" * 199 + "!"
    pg_engine.start_session("b-long", "w" * 200)
    pg_engine.record_step("b-long", step, usage=usage("gpt-4.1", "0.0030", 420.0))
    pg_engine.store.write(
        "b-long",
        lambda uow: uow.find(pg_engine.session_uuid("b-long")).fail_step(
            step="t" * 200, error_type=error, error_message="failed", usage=usage(model, "0", 0.0)
        ),
    )
    # When the dashboard is drawn 1280 pixels wide
    layout = _fit(site, 1280)
    # Then every panel still fits its box: the errors table's model cell (1,400 px) pushed its
    # error and calls columns out of view, and the funnel's step cell its figures
    assert layout["overflowing"] == [], layout
    # And each long name is in a cell that cuts it, shown whole when the pointer rests on it
    dom = dom_after_scripts(f"{site}/dashboard?since=1h")
    for name in (model, error, step):
        assert f'<td class="name" title="{name}">{name}</td>' in dom, name
