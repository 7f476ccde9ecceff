"""The dashboard page and its JSON, projected from the log on PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.analytics_schemas import DashboardRowOut, FunnelReportOut
from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def usage(model: str, cost: str, latency: float) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal(cost),
        latency_ms=latency,
    )


@pytest.fixture
def http(pg_engine: Engine) -> Iterator[TestClient]:
    for n, (model, cost, latency) in enumerate(
        [("gpt-4.1", "0.0030", 400.0), ("gpt-4.1", "0.0010", 200.0), ("deepseek-v3.2", "0.0001", 50.0)]
    ):
        pg_engine.start_session(f"d-{n}", "cs")
        pg_engine.record_step(f"d-{n}", "greet", next_step="answer", usage=usage(model, cost, latency))
    rate_limited = usage("deepseek-v3.2", "0", 10.0)
    pg_engine.store.write(
        "d-2",
        lambda uow: uow.find(pg_engine.session_uuid("d-2")).fail_step(
            step="answer", error_type="RateLimited", error_message="429", usage=rate_limited
        ),
    )
    pg_engine.abandon_session("d-1", "left")
    with TestClient(create_app(pg_engine)) as client:
        yield client


def test_the_dashboard_json_sums_cost_exactly_and_gives_exact_percentiles(http: TestClient) -> None:
    rows = {tuple(r["group"]): r for r in http.get("/v1/dashboard", params={"by": "model"}).json()}
    gpt = rows[("gpt-4.1",)]
    assert (gpt["calls"], gpt["cost_usd"]) == (2, "0.0040")
    assert gpt["latency_p50_ms"] == pytest.approx(300.0)
    deepseek = rows[("deepseek-v3.2",)]
    assert (deepseek["calls"], deepseek["errors"], deepseek["errors_by_type"]) == (2, 1, {"RateLimited": 1})


def test_a_week_reads_rollups_unless_exact_is_asked_for(http: TestClient) -> None:
    def gpt(**params: str) -> Any:
        rows = http.get("/v1/dashboard", params={"by": "model", "since": "7d", **params}).json()
        return next(r for r in rows if r["group"] == ["gpt-4.1"])

    rolled, exact = gpt(), gpt(exact="true")
    assert (rolled["calls"], rolled["cost_usd"]) == (exact["calls"], exact["cost_usd"]) == (2, "0.0040")
    assert exact["latency_p50_ms"] == pytest.approx(300.0)
    assert rolled["latency_p50_ms"] != exact["latency_p50_ms"]
    assert rolled["latency_p50_ms"] == pytest.approx(300.0, rel=0.02)


def test_the_funnel_json_counts_reach_and_drop_off(http: TestClient) -> None:
    [report] = http.get("/v1/funnel/cs").json()
    greet = report["steps"][0]
    assert (report["sessions"], greet["step"], greet["reached"]) == (3, "greet", 3)


def test_the_dashboard_page_draws_cost_latency_traffic_and_funnel(http: TestClient) -> None:
    response = http.get("/dashboard", params={"since": "1h"})
    assert response.status_code == 200
    page = response.text
    assert page.count("<svg") == 5
    for text in (
        "cost by model",
        "cost of successful steps vs failed and retried attempts",
        "latency by model",
        "model calls per minute",
        "funnel: \u2068cs\u2069 (3 sessions)",
        "gpt-4.1",
        "RateLimited",
        "$0.0041",
    ):
        assert text in page


def test_a_bad_window_or_grouping_is_a_422_with_a_message(http: TestClient) -> None:
    assert http.get("/dashboard", params={"since": "soon"}).status_code == 422
    response = http.get("/v1/dashboard", params={"by": "colour"})
    assert response.status_code == 422
    assert "colour" in response.json()["error"]


def test_an_in_memory_engine_has_no_dashboard() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine)) as client:
        response = client.get("/dashboard")
        data = client.get("/v1/dashboard")
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in response.text
    assert "PostgreSQL" in response.text
    assert "PostgreSQL" in data.json()["error"]


@pytest.mark.parametrize("since", ["bogus", "24", "99999999d", "-1h", "1h; DROP"])
def test_an_invalid_window_shows_the_page_with_the_error(http: TestClient, since: str) -> None:
    response = http.get("/dashboard", params={"since": since})
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("text/html")
    assert '<p class="error" role="alert">' in response.text
    assert "<svg" not in response.text


@pytest.mark.parametrize(
    ("since", "bucket", "columns"),
    [("1h", "minute", (61, 62)), ("24h", "hour", (25, 26)), ("7d", "day", (1, 2))],
)
def test_the_traffic_chart_picks_its_bucket_from_the_window_and_names_its_axes(
    http: TestClient, since: str, bucket: str, columns: tuple[int, ...]
) -> None:
    page = http.get("/dashboard", params={"since": since}).text
    chart = page[page.index(f"model calls per {bucket} (UTC)") :]
    chart = chart[: chart.index("</svg>")]
    assert f"time (UTC), one column per {bucket}" in chart
    assert ">calls</text>" in chart
    # One column per bucket of the window (a long window starts at its first day with calls)
    assert chart.count("<rect") in columns


def test_a_failed_call_keeps_its_model_and_draws_no_zero_latency(http: TestClient) -> None:
    page = http.get("/dashboard").text
    errors = page[page.index("errors by type") :]
    model = '<td class="name" title="deepseek-v3.2">deepseek-v3.2</td>'
    assert f'{model}<td class="name" title="RateLimited">RateLimited</td>' in errors
    assert "(none)" not in page


def test_the_dashboard_json_reprices_the_recorded_usage_at_another_models_price(http: TestClient) -> None:
    # When the dashboard is asked what the same tokens would have cost at claude-sonnet-4.5's price
    response = http.get("/v1/dashboard", params={"by": "model", "reprice_as": "claude-sonnet-4.5"})
    assert response.status_code == 200, response.text
    rows = {tuple(r["group"]): r for r in response.json()}
    # Then each group carries both figures: 2 gpt-4.1 calls of 100 input and 10 output tokens
    # at $3 / $15 per million (typed here, not read from the price table) cost $0.0009
    gpt = rows[("gpt-4.1",)]
    assert gpt["reprice_as"] == "claude-sonnet-4.5"
    assert (gpt["calls"], gpt["priced_calls"], gpt["cost_usd"]) == (2, 2, "0.0040")
    assert Decimal(gpt["repriced_cost_usd"]) == Decimal("0.0009")
    assert Decimal(gpt["difference_usd"]) == Decimal("-0.0031")


def test_repricing_at_a_model_with_no_price_is_a_422_naming_it(http: TestClient) -> None:
    response = http.get("/v1/dashboard", params={"reprice_as": "no-such-model"})
    assert response.status_code == 422
    assert "no-such-model" in response.json()["error"]


def test_the_funnel_of_a_workflow_whose_name_holds_a_slash_is_read_over_rest(pg_engine: Engine) -> None:
    # Given a workflow named as the engine allows, with a '/' (a team's prefix); the page drew
    # its funnel, but GET /v1/funnel/team%2Fsupport was a 404 "not found" path, as was team/support
    pg_engine.start_session("w-1", "team/support")
    pg_engine.record_step("w-1", "greet")
    with TestClient(create_app(pg_engine)) as client:
        for path in ("/v1/funnel/team%2Fsupport", "/v1/funnel/team/support"):
            # When its funnel is asked for, the slash escaped or not
            answer = client.get(path)
            # Then it is answered
            assert answer.status_code == 200, (path, answer.text)
            [report] = answer.json()
            assert (report["workflow"], report["sessions"]) == ("team/support", 1)
        # And a name holding a line break is refused as invalid, not taken for an unknown path
        refused = client.get("/v1/funnel/team%0Asupport")
        assert refused.status_code == 422, refused.text


def test_the_analytics_answers_have_the_shapes_their_openapi_entries_name(http: TestClient) -> None:
    # Given the document: each analytics route names its rows (they were untyped objects)
    paths = http.get("/openapi.json").json()["paths"]
    for path, name in (("/v1/dashboard", "DashboardRowOut"), ("/v1/funnel/{workflow}", "FunnelReportOut")):
        schema = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["items"] == {"$ref": f"#/components/schemas/{name}"}, path
    # When the analytics are read, grouped, repriced and as a funnel
    answers = [
        http.get("/v1/dashboard", params={"by": "model"}),
        http.get("/v1/dashboard", params=[("by", "model"), ("by", "day")]),
        http.get("/v1/dashboard", params={"by": "model", "reprice_as": "claude-sonnet-4.5"}),
        http.get("/v1/dashboard", params={"by": "workflow", "since": "7d"}),
    ]
    funnel = http.get("/v1/funnel/cs")
    # Then every row has exactly the shape named, no field more or less
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()
        for row in answer.json():
            DashboardRowOut.model_validate(row)
    assert "repriced_cost_usd" in answers[2].json()[0]
    assert funnel.status_code == 200, funnel.text
    for report in funnel.json():
        FunnelReportOut.model_validate(report)
    assert funnel.json()[0]["steps"]


@pytest.mark.parametrize("since", ["{{body}}", "{{icon}}x"])
def test_a_window_naming_a_placeholder_of_the_page_is_shown_as_typed(since: str) -> None:
    """The page's placeholders are filled in one pass: a window typed as ``{{body}}`` was put in
    first and then filled with the body too, so the error showed twice, once inside the
    page's ``<code>since=…</code>`` line."""
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine)) as client:
        response = client.get("/dashboard", params={"since": since})
    assert response.status_code == 422
    assert response.text.count('role="alert"') == 1
    assert f"<code>since={since}</code>" in response.text


def test_a_long_window_without_model_calls_draws_one_day_not_every_day_of_it(pg_engine: Engine) -> None:
    """A long window starts its traffic chart at its first day with calls; with none, at today.
    It drew every day of the window: 700,000 columns, a 70 MB page, for ``since=99999w``."""
    # Given a tenant whose sessions have made no model call
    pg_engine.start_session("quiet", "cs")
    with TestClient(create_app(pg_engine)) as client:
        # When the page is asked for the longest window
        page = client.get("/dashboard", params={"since": "99999w"}).text
    # Then its traffic chart is today's one column, on a page of ordinary size
    chart = page[page.index("model calls per day (UTC)") :]
    chart = chart[: chart.index("</svg>")]
    assert chart.count("<rect") == 1
    assert len(page) < 100_000


def test_the_cost_tile_shows_every_decimal_of_a_cost_longer_than_28_digits(pg_engine: Engine) -> None:
    """The tiles add the models' costs in Python: at the default 28 significant digits a cost of
    40 decimals read $0.1234567890123456789012345679 on the page."""
    # Given a call whose cost has 40 decimals
    cost = "0.1234567890123456789012345678901234567891"
    pg_engine.start_session("precise", "cs")
    pg_engine.record_step("precise", "greet", usage=usage("gpt-4.1", cost, 5.0))
    # When the page is drawn
    with TestClient(create_app(pg_engine)) as client:
        page = client.get("/dashboard", params={"since": "1h"}).text
    # Then the cost tile holds the cost to its last decimal
    assert f'<div class="tile"><b>${cost}</b><span>cost</span></div>' in page


def test_the_page_names_the_error_type_sessions_failed_with_at_a_step(http: TestClient) -> None:
    # The drop-off cell read "failed 1" where the CLI reads "failed:RateLimited 1" and the JSON
    # gives failed_by_error {"RateLimited": 1}
    page = http.get("/dashboard", params={"since": "1h"}).text
    funnel = page[page.index("funnel: \u2068cs\u2069") :]
    cause = "failed:\u2068RateLimited\u2069 1"
    assert f'<td title="{cause}">{cause}</td>' in funnel
    assert '<td title="abandoned 1">abandoned 1</td>' in funnel


def test_the_page_says_why_sessions_that_reached_no_step_stopped(pg_engine: Engine) -> None:
    pg_engine.start_session("n-0", "cs")
    pg_engine.record_step("n-0", "greet")
    pg_engine.start_session("n-1", "cs")
    pg_engine.abandon_session("n-1", "left")
    with TestClient(create_app(pg_engine)) as client:
        page = client.get("/dashboard").text
    assert "1 of 2 sessions reached no step: abandoned 1" in page


def test_windows_and_the_traffic_chart_count_from_the_clock_the_calls_were_stamped_by(
    database_url: str, pg_schema: str
) -> None:
    # Given an engine whose clock (the database server's, by default) is 10 minutes behind this
    # host's: every call is stamped by that clock
    def behind() -> datetime:
        return datetime.now(UTC) - timedelta(minutes=10)

    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema), clock=behind) as engine:
        for n in range(3):
            engine.start_session(f"k-{n}", "cs")
            engine.record_step(f"k-{n}", "greet", usage=usage("gpt-4.1", "0.0010", 100.0))
        with TestClient(create_app(engine)) as client:
            # When the last 5 minutes are asked for, as JSON and as the page
            rows = client.get("/v1/dashboard", params={"since": "5m"}).json()
            page = client.get("/dashboard", params={"since": "5m"}).text
    # Then the calls just made are in them: the window was measured from this host's clock,
    # which put them 10 minutes before it ([] as JSON, and a page of nothing)
    assert [(r["group"], r["calls"]) for r in rows] == [(["gpt-4.1"], 3)]
    assert '<div class="tile"><b>3</b><span>model calls</span></div>' in page
    # And the traffic chart draws them (its last column was this host's minute: every call
    # stamped after it was left out, its columns all 0 beside a tile of 3 calls)
    chart = page[page.index("model calls per minute") :]
    drawn = re.findall(r"<title>\d\d:\d\d: (\d+)</title>", chart[: chart.index("</svg>")])
    assert sum(int(n) for n in drawn) == 3, drawn


def test_the_latency_chart_says_exact_only_for_windows_that_read_raw_rows(http: TestClient) -> None:
    # A day reads the raw rows: exact percentiles (gpt-4.1's p50 of 200 and 400 ms is 300)
    day = http.get("/dashboard", params={"since": "24h"}).text
    assert "latency by model (ms, exact percentiles)" in day
    # A week reads the roll-ups, whose percentiles are within 2 % (gpt-4.1's p50 reads 298.06):
    # the chart called them exact
    week = http.get("/dashboard", params={"since": "7d"}).text
    assert "exact percentiles" not in week
    assert "latency by model (ms, percentiles within 2 %: roll-ups)" in week


def test_the_repriced_difference_names_the_recorded_cost_it_is_taken_from(pg_engine: Engine) -> None:
    # Given a gpt-4.1 step of 100 / 10 tokens recorded at $0.0030, answered at a retry that was
    # billed $0.0010 more (its tokens are not in the dashboard's counts)
    pg_engine.start_session("r-1", "cs")
    retried = replace(usage("gpt-4.1", "0.0030", 100.0), attempts=2, retried_cost_usd=Decimal("0.0010"))
    pg_engine.record_step("r-1", "greet", usage=retried)
    with TestClient(create_app(pg_engine)) as client:
        params = {"by": "model", "reprice_as": "claude-sonnet-4.5"}
        [row] = client.get("/v1/dashboard", params=params).json()
    # Then the row says which cost the difference is taken from: the answers' $0.0030 (their
    # tokens are what is repriced, $0.00045 at $3 / $15 per million), not cost_usd's $0.0040;
    # repriced minus cost_usd read -0.00355 where difference_usd said -0.00255
    assert row["cost_usd"] == "0.0040"
    assert Decimal(row["repriced_cost_usd"]) == Decimal("0.00045")
    assert Decimal(row["recorded_cost_usd"]) == Decimal("0.0030")
    assert Decimal(row["difference_usd"]) == Decimal(row["repriced_cost_usd"]) - Decimal(
        row["recorded_cost_usd"]
    )


def test_a_days_window_reads_raw_rows_though_this_hosts_clock_is_ahead_of_the_engines(
    database_url: str, pg_schema: str
) -> None:
    # Given an engine whose clock is 2 hours behind this host's (the database server's clock)
    def behind() -> datetime:
        return datetime.now(UTC) - timedelta(hours=2)

    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema), clock=behind) as engine:
        for n, latency in enumerate((200.0, 400.0)):
            engine.start_session(f"c-{n}", "cs")
            engine.record_step(f"c-{n}", "greet", usage=usage("gpt-4.1", "0.0010", latency))
        with TestClient(create_app(engine)) as client:
            # When the last 24 hours are asked for (the default window, documented as exact)
            [row] = client.get("/v1/dashboard", params={"since": "24h"}).json()
    # Then the p50 is the exact 300 ms: the window was judged 26 hours long from this host's
    # clock, so it read the roll-ups' 298.06
    assert row["latency_p50_ms"] == 300.0
