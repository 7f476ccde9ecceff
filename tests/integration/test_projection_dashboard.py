"""A small history whose dashboard, reprice and funnel numbers are worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import Price, Projector, dashboard, funnel_report, projector_for, reprice
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def usage(model: str, inp: int, out: int, cost: str, latency: float, cached: int = 0) -> LlmUsage:
    provider = {"deepseek-v3.2": "deepseek", "gpt-4.1": "openai"}.get(model, "google")
    return LlmUsage(
        provider=provider,
        request_model=model,
        response_model=model,
        input_tokens=inp,
        output_tokens=out,
        cache_read_input_tokens=cached,
        cost_usd=Decimal(cost),
        latency_ms=latency,
    )


def history() -> list[SessionScript]:
    """Six sessions of workflow ``support`` (classify → answer → close)."""
    a = SessionScript("a", "support", at(0), metadata={"channel": "web"})
    a.step("classify", at(10), usage=usage("deepseek-v3.2", 1000, 100, "0.0004", 100, cached=200))
    a.step("answer", at(40), usage=usage("gpt-4.1", 2000, 500, "0.0080", 300))
    a.step("close", at(60)).complete(at(61))
    b = SessionScript("b", "support", at(5), metadata={"channel": "app"})
    b.step("classify", at(25), usage=usage("deepseek-v3.2", 800, 80, "0.0003", 200))
    b.fail("answer", at(45), "rate_limited", usage=usage("gpt-4.1", 0, 0, "0", 50))
    c = SessionScript("c", "support", at(10), metadata={"channel": "web"})
    c.step("classify", at(20), usage=usage("deepseek-v3.2", 1200, 120, "0.0005", 400))
    c.expire(at(100))
    d = SessionScript("d", "support", at(15)).fail("classify", at(25), "timeout")
    e = SessionScript("e", "support", at(20)).abandon(at(30))
    f = SessionScript("f", "support", at(30))
    f.step("classify", at(90), usage=usage("gemini-2.5-flash", 500, 50, "0.0001", 1000))
    return [a, b, c, d, e, f]


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    # The projection schemas are named after the engine's: the pg_schema fixture drops them.
    append(pg_engine.log, interleave(history()))
    projector = projector_for(pg_engine, batch_size=4)
    projector.catch_up()
    return projector


def test_dashboard_by_model_matches_the_hand_computed_numbers(projector: Projector) -> None:
    with projector.connect() as conn:
        rows = {
            r.group[0]: r
            for r in dashboard(conn, projector.names.reader, since=T0, by=["model"], tenant="default")
        }
    assert list(rows) == ["gpt-4.1", "deepseek-v3.2", "gemini-2.5-flash", None]
    deepseek = rows["deepseek-v3.2"]
    assert (
        deepseek.calls,
        deepseek.errors,
        deepseek.input_tokens,
        deepseek.output_tokens,
        deepseek.cached_tokens,
    ) == (3, 0, 3000, 300, 200)
    assert deepseek.cost_usd == Decimal("0.0012")
    # latencies 100, 200, 400: p95 sits at 1.9 of 2 gaps -> 200 + 0.9 * 200
    assert deepseek.latency_avg_ms == pytest.approx(233.3333333)
    assert (deepseek.latency_p50_ms, deepseek.latency_p95_ms) == (200, pytest.approx(380))
    assert deepseek.latency_p99_ms == pytest.approx(396)
    gpt = rows["gpt-4.1"]
    assert (gpt.calls, gpt.errors, gpt.errors_by_type, gpt.cost_usd) == (
        2,
        1,
        {"rate_limited": 1},
        Decimal("0.0080"),
    )
    assert (gpt.latency_p50_ms, gpt.latency_p95_ms, gpt.latency_p99_ms) == (
        175,
        pytest.approx(287.5),
        pytest.approx(297.5),
    )
    unknown = rows[None]  # no model: d failed before any call
    assert (unknown.calls, unknown.errors_by_type, unknown.latency_p50_ms) == (1, {"timeout": 1}, None)
    assert sum(r.cost_usd for r in rows.values()) == Decimal("0.0093")


def test_dashboard_groups_by_workflow_and_step_and_by_minute(projector: Projector) -> None:
    with projector.connect() as conn:
        by_step = {
            r.group: r.calls
            for r in dashboard(
                conn, projector.names.reader, since=T0, by=["workflow", "step"], tenant="default"
            )
        }
        windowed = dashboard(
            conn, projector.names.reader, since=at(30), until=at(60), by=[], tenant="default"
        )
        minutes = dashboard(conn, projector.names.reader, since=T0, by=["minute"], tenant="default")
    assert by_step == {("support", "classify"): 5, ("support", "answer"): 2}
    # calls at 40 s (answer) and 45 s (failed answer) fall in [30 s, 60 s)
    assert (windowed[0].calls, windowed[0].cost_usd) == (2, Decimal("0.0080"))
    assert sum(r.calls for r in minutes) == 7
    assert all(r.group[0].second == 0 for r in minutes)


def test_reprice_as_another_model_prices_recorded_tokens(projector: Projector) -> None:
    gpt = Price(Decimal("0.000002"), Decimal("0.000008"), Decimal("0.0000005"))
    with projector.connect() as conn:
        rows = {
            r.group[0]: r
            for r in reprice(
                conn, projector.names.reader, {"gpt-4.1": gpt}, as_model="gpt-4.1", since=T0, tenant="default"
            )
        }
    # a: 800*2e-6 + 200*5e-7 + 100*8e-6 = 0.0025; b: 0.00224; c: 0.00336
    assert rows["deepseek-v3.2"].repriced_cost_usd == Decimal("0.00810")
    assert rows["deepseek-v3.2"].recorded_cost_usd == Decimal("0.0012")
    assert rows["deepseek-v3.2"].difference_usd == Decimal("0.00690")
    # the recorded gpt-4.1 call was priced this way: 2000*2e-6 + 500*8e-6
    assert rows["gpt-4.1"].repriced_cost_usd == Decimal("0.0080")
    assert rows["gpt-4.1"].difference_usd == 0


def test_reprice_under_a_price_table_skips_models_it_lacks(projector: Projector) -> None:
    table = {"deepseek-v3.2": Price(Decimal("0.00000028"), Decimal("0.00000042"), Decimal("0.000000028"))}
    with projector.connect() as conn:
        rows = {
            r.group[0]: r for r in reprice(conn, projector.names.reader, table, since=T0, tenant="default")
        }
    assert (rows["gpt-4.1"].priced_calls, rows["gpt-4.1"].repriced_cost_usd) == (0, 0)
    # uncached input (800+800+1200)*2.8e-7 = 0.000784; cached 200*2.8e-8 = 0.0000056;
    # output (100+80+120)*4.2e-7 = 0.000126
    assert rows["deepseek-v3.2"].repriced_cost_usd == Decimal("0.0009156")


def test_funnel_matches_the_hand_computed_conversions_and_causes(projector: Projector) -> None:
    with projector.connect() as conn:
        [report] = funnel_report(conn, projector.names.reader, "support", tenant="default", read="raw")
    assert report.sessions == 6
    assert report.before_first_step == {"abandoned": 1}
    classify, answer, close = report.steps
    assert [s.step for s in report.steps] == ["classify", "answer", "close"]
    assert (classify.reached, classify.processed) == (5, 4)
    assert classify.overall_conversion == pytest.approx(5 / 6)
    assert classify.dropped == {"expired": 1, "failed": 1}
    assert classify.failed_by_error == {"timeout": 1}
    assert (classify.in_progress, classify.completed) == (1, 0)
    # reached after 10, 20, 10, 10, 60 s: p95 at 3.8 of 4 gaps -> 20 + 0.8 * 40
    assert (classify.p50_seconds, classify.p95_seconds) == (10, pytest.approx(52))
    assert (answer.reached, answer.overall_conversion, answer.step_conversion) == (
        2,
        pytest.approx(2 / 6),
        pytest.approx(0.4),
    )
    assert (answer.dropped, answer.failed_by_error, answer.p50_seconds) == (
        {"failed": 1},
        {"rate_limited": 1},
        40,
    )
    assert (close.reached, close.step_conversion, close.completed, close.dropped_total) == (1, 0.5, 1, 0)


def test_funnel_breaks_down_by_metadata_and_by_model(projector: Projector) -> None:
    with projector.connect() as conn:
        channels = {
            r.segment: r
            for r in funnel_report(
                conn, projector.names.reader, "support", by="metadata.channel", tenant="default"
            )
        }
        models = {
            r.segment: r.sessions
            for r in funnel_report(conn, projector.names.reader, "support", by="model", tenant="default")
        }
        ordered = funnel_report(
            conn, projector.names.reader, "support", steps=["answer", "close"], tenant="default"
        )
    assert {k: v.sessions for k, v in channels.items()} == {None: 3, "app": 1, "web": 2}
    assert [s.reached for s in channels["web"].steps] == [2, 1, 1]
    assert models == {None: 2, "deepseek-v3.2": 3, "gemini-2.5-flash": 1}
    assert [s.step for s in ordered[0].steps] == ["answer", "close"]
    # d failed at classify, a step left out of the order: it counts as still in progress
    assert ordered[0].before_first_step == {"abandoned": 1, "expired": 1, "in_progress": 2}


def test_reprice_finds_the_price_of_a_dated_or_provider_prefixed_model(
    pg_engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given calls whose provider answered with a dated name, and one asked as provider/model
    dated = LlmUsage(
        provider="openai",
        request_model="gpt-4.1",
        response_model="gpt-4.1-2025-04-14",
        input_tokens=1000,
        output_tokens=100,
        cost_usd=Decimal("0.0028"),
    )
    prefixed = LlmUsage(
        provider="openai",
        request_model="openai/gpt-4.1",
        response_model="",
        input_tokens=1000,
        output_tokens=100,
        cost_usd=Decimal("0.0028"),
    )
    script = SessionScript("p", "support", at(0))
    script.step("one", at(1), usage=dated).step("two", at(2), usage=prefixed)
    append(pg_engine.log, interleave([script]))
    projector = projector_for(pg_engine)
    projector.catch_up()
    table = {"gpt-4.1": Price(Decimal("0.000002"), Decimal("0.000008"))}

    # When the recorded usage is repriced under a table that only knows "gpt-4.1"
    with projector.connect() as conn:
        [row] = reprice(conn, projector.names.reader, table, since=T0, by=(), tenant="default")

    # Then both calls found that price: 2 x (1000*2e-6 + 100*8e-6)
    assert (row.calls, row.priced_calls, row.repriced_cost_usd) == (2, 2, Decimal("0.0056"))


def test_reprice_leaves_out_calls_whose_recorded_cost_is_not_known(pg_engine: Engine) -> None:
    # Given two gpt-4.1 calls of the same tokens: one priced at $0.001, one unpriced (its cost
    # not known: recorded as 0, which the dashboard never counts as $0)
    tokens = {"provider": "openai", "request_model": "gpt-4.1", "input_tokens": 1000, "output_tokens": 100}
    priced = LlmUsage(**tokens, cost_usd=Decimal("0.001"))
    unpriced = LlmUsage(**tokens, unpriced=True)
    script = SessionScript("u", "support", at(0))
    script.step("one", at(1), usage=priced).step("two", at(2), usage=unpriced)
    append(pg_engine.log, interleave([script]))
    projector = projector_for(pg_engine)
    projector.catch_up()
    table = {"gpt-4.1": Price(Decimal("0.000002"), Decimal("0.000008"))}

    # When the usage is repriced, at gpt-4.1's price and under the table
    with projector.connect() as conn:
        repriced = [
            reprice(conn, projector.names.reader, table, as_model=as_model, since=T0, by=(), tenant="default")
            for as_model in ("gpt-4.1", None)
        ]

    # Then only the priced call is compared: 1000*2e-6 + 100*8e-6 = 0.0028 against 0.001
    for [row] in repriced:
        assert (row.calls, row.priced_calls) == (2, 1)
        assert (row.recorded_cost_usd, row.repriced_cost_usd) == (Decimal("0.001"), Decimal("0.0028"))
        assert row.difference_usd == Decimal("0.0018")


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_calls_refused_before_any_request_have_no_latency_in_the_dashboard(
    pg_engine: Engine, read: str
) -> None:
    # Given a model answering in 500 ms, then an open breaker refusing three calls at once, each
    # recorded as StepFailed("circuit_open") naming the model, attempts 0, its refusal's 0.08 ms
    answered = LlmUsage(provider="openai", request_model="gpt-4.1", response_model="gpt-4.1", latency_ms=500)
    refused = LlmUsage(provider="openai", request_model="gpt-4.1", latency_ms=0.08, attempts=0)
    script = SessionScript("breaker", "support", at(0))
    script.step("one", at(1), usage=answered).step("two", at(2), usage=answered)
    for second in (3, 4, 5):
        script.fail("three", at(second), "circuit_open", usage=refused)
    append(pg_engine.log, interleave([script]))
    projector = projector_for(pg_engine)
    projector.catch_up()

    # When the dashboard is read, from the calls or from the roll-ups
    with projector.connect() as conn:
        [row] = dashboard(conn, projector.names.reader, since=T0, by=["model"], tenant="default", read=read)

    # Then the refusals are calls and errors, but no latency: the model's p50 was 0.08 ms, its
    # average 200 ms, though every request it was sent took 500 ms
    assert (row.calls, row.errors_by_type) == (5, {"circuit_open": 3})
    assert row.latency_avg_ms == pytest.approx(500)
    assert row.latency_p50_ms == pytest.approx(500, rel=0.05)


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_a_call_whose_latency_was_never_measured_has_none_in_the_dashboard(
    pg_engine: Engine, read: str
) -> None:
    # Given a model answering in 500 ms, a lost worker's call (StepFailed("worker_lost"): what
    # it took is not known, recorded as LlmUsage's default 0.0) and a call recorded elsewhere
    # without a latency (record_step's usage, 0.0 by default)
    answered = LlmUsage(provider="openai", request_model="gpt-4.1", response_model="gpt-4.1", latency_ms=500)
    lost = LlmUsage(request_model="gpt-4.1", unpriced=True, extra={"usage_reported": False})
    unmeasured = LlmUsage(provider="openai", request_model="gpt-4.1", input_tokens=10, output_tokens=5)
    script = SessionScript("lost", "support", at(0))
    script.step("one", at(1), usage=answered).step("two", at(2), usage=answered)
    script.fail("three", at(3), "worker_lost", usage=lost).step("four", at(4), usage=unmeasured)
    append(pg_engine.log, interleave([script]))
    projector = projector_for(pg_engine)
    projector.catch_up()

    # When the dashboard is read, from the calls or from the roll-ups
    with projector.connect() as conn:
        [row] = dashboard(conn, projector.names.reader, since=T0, by=["model"], tenant="default", read=read)

    # Then both are calls, but their 0 ms is no latency: the model's p50 read 250 ms, its
    # average 250 ms, though every latency measured was 500 ms
    assert (row.calls, row.errors_by_type) == (4, {"worker_lost": 1})
    assert row.latency_avg_ms == pytest.approx(500)
    assert row.latency_p50_ms == pytest.approx(500, rel=0.05)
