"""The cost dashboard read from roll-ups equals the raw query over ``llm_calls``: sums and
counts exactly, percentiles within the sketch's stated relative error, for any window and
grouping; the roll-ups survive a rebuild and a recount after repricing in place."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings
from flowledger.projections import DashboardRow, Projector, dashboard, projector_for, verify
from flowledger.projections.cost_rollups import recount_rollups
from flowledger.projections.latency_sketch import RELATIVE_ERROR
from tests.support.schemas import drop_schemas
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 22, 17, 13, tzinfo=UTC)
SPAN = timedelta(days=2, hours=5)
MODELS = ("deepseek-v3.2", "gpt-4.1", "gemini-2.5-flash")
STEPS = ("classify", "answer", "close")
GROUPINGS = (
    (),
    ("model",),
    ("workflow", "step"),
    ("provider", "source"),
    ("hour",),
    ("day", "model"),
    ("minute",),
)


def history(seed: int = 7) -> list[SessionScript]:
    """Sessions of two tenants and two workflows over ``SPAN``, many calls sharing a minute,
    latencies from 0 to 40 s (some missing: failures without usage)."""
    rng = random.Random(seed)
    scripts = []
    for n in range(160):
        at = T0 + timedelta(seconds=rng.uniform(0, SPAN.total_seconds()))
        tenant = "acme" if n % 5 else "other"
        script = SessionScript(f"s{n}", rng.choice(["support", "sales"]), at, tenant=tenant)
        for step in STEPS[: rng.randint(1, 3)]:
            at += timedelta(seconds=rng.expovariate(1 / 40))
            model = rng.choice(MODELS)
            latency = 0.0 if rng.random() < 0.03 else round(rng.lognormvariate(6.5, 1.2), 3)
            used = LlmUsage(
                provider=model.split("-")[0],
                request_model=model,
                response_model=model,
                input_tokens=rng.randint(100, 4000),
                output_tokens=rng.randint(0, 800),
                cache_read_input_tokens=rng.randint(0, 100),
                reasoning_output_tokens=rng.randint(0, 50),
                cost_usd=Decimal(rng.randint(0, 99999)) / Decimal(10**7),
                latency_ms=latency,
            )
            roll = rng.random()
            if roll < 0.08:
                script.fail(step, at, rng.choice(["timeout", "http_429"]))
            elif roll < 0.15:
                script.fail(step, at, "rate_limited", usage=used)
            else:
                script.step(step, at, usage=used)
        scripts.append(script)
    return scripts


@pytest.fixture(scope="module")
def projector(database_url: str) -> Iterator[Projector]:
    """One history projected in odd-sized batches, shared by the module's tests (read-only but
    for the last test, which runs on its own copy)."""
    schema = f"r_{uuid.uuid4().hex[:12]}"
    engine = Engine(settings=Settings(home=Path("/nonexistent"), database_url=database_url, schema=schema))
    try:
        append(engine.log, interleave(history()), per_transaction=50)
        projector = projector_for(engine, batch_size=37)
        projector.catch_up()
        yield projector
    finally:
        engine.close()
        drop_schemas(database_url, schema)


def assert_same(raw: list[DashboardRow], rolled: list[DashboardRow]) -> None:
    """Sums and counts equal, rows in the same order, percentiles within the stated bound."""
    assert [r.group for r in rolled] == [r.group for r in raw]
    for exact, approx in zip(raw, rolled, strict=True):
        assert (approx.calls, approx.errors, approx.errors_by_type) == (
            exact.calls,
            exact.errors,
            exact.errors_by_type,
        )
        assert (approx.input_tokens, approx.output_tokens, approx.cached_tokens, approx.reasoning_tokens) == (
            exact.input_tokens,
            exact.output_tokens,
            exact.cached_tokens,
            exact.reasoning_tokens,
        )
        assert (
            approx.cost_usd,
            approx.succeeded_cost_usd,
            approx.retried_cost_usd,
            approx.failed_cost_usd,
            approx.unpriced_calls,
            approx.cache_creation_tokens,
        ) == (
            exact.cost_usd,
            exact.succeeded_cost_usd,
            exact.retried_cost_usd,
            exact.failed_cost_usd,
            exact.unpriced_calls,
            exact.cache_creation_tokens,
        )
        if exact.latency_avg_ms is None:
            assert approx.latency_avg_ms is None
        else:
            assert approx.latency_avg_ms == pytest.approx(exact.latency_avg_ms, rel=1e-9)
        for mine, theirs in (
            (approx.latency_p50_ms, exact.latency_p50_ms),
            (approx.latency_p95_ms, exact.latency_p95_ms),
            (approx.latency_p99_ms, exact.latency_p99_ms),
        ):
            if theirs is None:
                assert mine is None
            else:
                assert mine is not None
                assert abs(mine - theirs) <= RELATIVE_ERROR * theirs + 1e-9


offsets = st.integers(-3600, int(SPAN.total_seconds()) + 3600)


@given(
    start=offsets,
    length=st.none() | st.integers(1, int(SPAN.total_seconds())),
    by=st.sampled_from(GROUPINGS),
    tenant=st.sampled_from(["acme", "other"]),
)
def test_rollup_dashboard_equals_the_raw_query_for_any_window(
    projector: Projector, start: int, length: int | None, by: tuple[str, ...], tenant: str
) -> None:
    since = T0 + timedelta(seconds=start, microseconds=start % 7 * 1000)
    until = None if length is None else since + timedelta(seconds=length)
    with projector.connect() as conn:
        reader = projector.names.reader
        raw = dashboard(conn, reader, tenant=tenant, since=since, until=until, by=by, read="raw")
        rolled = dashboard(conn, reader, tenant=tenant, since=since, until=until, by=by, read="rollups")
    assert_same(raw, rolled)


def test_a_long_window_reads_rollups_and_a_short_one_raw_rows(projector: Projector) -> None:
    with projector.connect() as conn:
        reader = projector.names.reader
        # auto: percentiles of a two-day window come from the sketch (not percentile_cont) ...
        long = dashboard(conn, reader, tenant="acme", since=T0, until=T0 + timedelta(days=2), by=[])
        raw = dashboard(
            conn, reader, tenant="acme", since=T0, until=T0 + timedelta(days=2), by=[], read="raw"
        )
        assert long[0].calls == raw[0].calls > 100
        assert long[0].latency_p50_ms != raw[0].latency_p50_ms
        # ... and an hour's are exact
        hour = dashboard(conn, reader, tenant="acme", since=T0, until=T0 + timedelta(hours=1), by=[])
        exact = dashboard(
            conn, reader, tenant="acme", since=T0, until=T0 + timedelta(hours=1), by=[], read="raw"
        )
        assert hour == exact
        with pytest.raises(ValidationError, match="read"):
            dashboard(conn, reader, tenant="acme", since=T0, by=[], read="fast")


def test_rollup_rows_hold_every_call_once_per_grain(projector: Projector) -> None:
    with projector.connect() as conn:
        reader = sql.Identifier(projector.names.reader)
        calls = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.llm_calls WHERE tenant IS NOT NULL").format(reader)
        ).fetchone()
        per_grain = conn.execute(
            sql.SQL(
                "SELECT grain, sum(calls), sum(latency_calls),"
                " sum((SELECT sum(n) FROM unnest(latency_counts) AS n)) FROM {}.cost_rollups GROUP BY grain"
            ).format(reader)
        ).fetchall()
        timed = conn.execute(
            sql.SQL("SELECT count(latency_ms) FROM {}.llm_calls WHERE tenant IS NOT NULL").format(reader)
        ).fetchone()
    assert calls is not None
    assert timed is not None
    assert sorted(per_grain) == [(g, calls[0], timed[0], timed[0]) for g in ("day", "hour", "minute")]


def test_rebuild_gives_the_same_rollups_and_a_recount_follows_prices_changed_in_place(
    projector: Projector,
) -> None:
    # Given the live build, projected in batches of 37
    assert verify(projector, ["cost"]) == []
    with projector.connect() as conn:
        reader = projector.names.reader
        (live,) = conn.execute(
            sql.SQL("SELECT schema_name FROM {}.active WHERE projection = 'cost'").format(
                sql.Identifier(projector.names.control)
            )
        ).fetchone() or ("",)
        window = {"since": T0 + timedelta(hours=20), "until": T0 + timedelta(hours=44)}
        # When a day's costs change in place and that range is recounted
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "UPDATE {}.llm_calls SET cost_usd = cost_usd * 3 WHERE occurred_at >= %(since)s"
                    " AND occurred_at < %(until)s"
                ).format(sql.Identifier(live)),
                window,
            )
            with conn.cursor() as cur:
                recount_rollups(cur, live, window["since"], window["until"])
        # Then the roll-ups agree with the changed rows, for every tenant and grouping
        for tenant in ("acme", "other"):
            for by in GROUPINGS:
                raw = dashboard(conn, reader, tenant=tenant, since=T0, by=by, read="raw")
                rolled = dashboard(conn, reader, tenant=tenant, since=T0, by=by, read="rollups")
                assert_same(raw, rolled)


def test_rollup_costs_are_exact_to_every_decimal_whatever_the_threads_decimal_context(
    pg_engine: Engine,
) -> None:
    """The roll-up read adds money in Python: under the thread's decimal context it rounded to
    28 significant digits (0.1234567890123456789012345679 for a call of 40 decimals), and an
    embedding service's ``getcontext().prec = 6`` would round every sum to 6."""
    # Given two calls whose costs have 40 decimals
    costs = [Decimal("0.1234567890123456789012345678901234567891"), Decimal("1E-40")]
    for n, cost in enumerate(costs):
        pg_engine.start_session(f"s-{n}", "support")
        used = LlmUsage(
            request_model="gpt-4.1", input_tokens=1, output_tokens=1, cost_usd=cost, retried_cost_usd=cost
        )
        pg_engine.record_step(f"s-{n}", "answer", usage=used)
    projector = projector_for(pg_engine)
    projector.catch_up()
    half = Decimal("0.1234567890123456789012345678901234567892")  # the answers' (and the retries')
    exact = Decimal("0.2469135780246913578024691357802469135784")
    # When the dashboard is read from the roll-ups, in a thread whose context keeps 6 digits
    since = datetime.now(UTC) - timedelta(days=3)
    with projector.connect_reader() as conn, localcontext(prec=6):
        raw = dashboard(conn, projector.names.reader, tenant="default", since=since, read="raw")
        rolled = dashboard(conn, projector.names.reader, tenant="default", since=since, read="rollups")
    # Then its cost and the cost's parts are the raw query's, to the last decimal
    assert [r.cost_usd for r in raw] == [exact]
    for read in (raw, rolled):
        [row] = read
        assert (row.cost_usd, row.succeeded_cost_usd, row.retried_cost_usd) == (exact, half, half)


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_time_buckets_are_given_in_utc_whatever_the_sessions_time_zone(pg_engine: Engine, read: str) -> None:
    """A bucket is a UTC hour: on a connection whose TimeZone was Asia/Kolkata (a server's
    default, or PGTZ) it came back as 06:30+05:30, and the CLI printed buckets starting at :30."""
    pg_engine.start_session("s-1", "support")
    pg_engine.record_step("s-1", "answer", usage=LlmUsage(request_model="gpt-4.1", input_tokens=1))
    projector = projector_for(pg_engine)
    projector.catch_up()
    since = datetime.now(UTC) - timedelta(days=3)
    with projector.connect_reader() as conn:
        conn.execute("SET TIME ZONE 'Asia/Kolkata'")
        [row] = dashboard(conn, projector.names.reader, tenant="default", since=since, by=["hour"], read=read)
    [bucket] = row.group
    assert bucket.utcoffset() == timedelta(0)
    assert bucket.isoformat().endswith(":00:00+00:00")
