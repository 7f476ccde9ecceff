"""The funnel read from roll-ups equals the raw funnel query: every count and conversion
exactly, time-to-reach percentiles within the sketch's stated relative error, for any window,
with and without the model breakdown and a given step order; and the roll-ups a live build
kept batch by batch (sessions changing across batches) equal a rebuild's."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowledger.domain import LlmUsage
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings
from flowledger.projections import FunnelReport, Projector, funnel_report, projector_for, verify
from flowledger.projections.latency_sketch import RELATIVE_ERROR
from tests.support.schemas import drop_schemas
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 22, 17, 13, tzinfo=UTC)
SPAN = timedelta(days=2, hours=5)
STEPS = ("classify", "lookup", "answer", "escalate", "close")


def history(seed: int = 11) -> list[SessionScript]:
    """Sessions of two tenants that branch, retry, fail, time out, finish or stay open."""
    rng = random.Random(seed)
    scripts = []
    for n in range(180):
        at = T0 + timedelta(seconds=rng.uniform(0, SPAN.total_seconds()))
        script = SessionScript(f"s{n}", "support", at, tenant="acme" if n % 4 else "other")
        path = [s for s in STEPS if rng.random() < 0.7] or ["classify"]
        if rng.random() < 0.2:
            rng.shuffle(path)
        for step in path:
            at += timedelta(seconds=rng.choice([0, rng.expovariate(1 / 60)]))
            roll = rng.random()
            model = rng.choice(["m1", "m2", "m3"])
            used = LlmUsage(request_model=model, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.001"))
            if roll < 0.15:
                script.start_step(step, at)
                break
            if roll < 0.3:
                script.fail(step, at, rng.choice(["timeout", "http_429", ""]), usage=used)
                if rng.random() < 0.5:
                    break
                at += timedelta(seconds=1)
            script.step(step, at, usage=used if rng.random() < 0.8 else None)
        else:
            ending = rng.choice([None, "complete", "expire", "abandon"])
            if ending is not None:
                getattr(script, ending)(at + timedelta(seconds=1))
        scripts.append(script)
    return scripts


@pytest.fixture(scope="module")
def projector(database_url: str) -> Iterator[Projector]:
    schema = f"f_{uuid.uuid4().hex[:12]}"
    engine = Engine(settings=Settings(home=Path("/nonexistent"), database_url=database_url, schema=schema))
    try:
        append(engine.log, interleave(history()), per_transaction=50)
        projector = projector_for(engine, batch_size=23)
        projector.catch_up()
        yield projector
    finally:
        engine.close()
        drop_schemas(database_url, schema)


def assert_same(raw: list[FunnelReport], rolled: list[FunnelReport]) -> None:
    assert [(r.segment, r.sessions, r.before_first_step) for r in rolled] == [
        (r.segment, r.sessions, r.before_first_step) for r in raw
    ]
    for exact, approx in zip(raw, rolled, strict=True):
        assert [s.step for s in approx.steps] == [s.step for s in exact.steps]
        for a, e in zip(approx.steps, exact.steps, strict=True):
            assert (a.reached, a.processed, a.dropped, a.failed_by_error, a.in_progress, a.completed) == (
                e.reached,
                e.processed,
                e.dropped,
                e.failed_by_error,
                e.in_progress,
                e.completed,
            )
            assert (a.overall_conversion, a.step_conversion) == (e.overall_conversion, e.step_conversion)
            for mine, theirs in ((a.p50_seconds, e.p50_seconds), (a.p95_seconds, e.p95_seconds)):
                assert (mine is None) == (theirs is None)
                if mine is not None and theirs is not None:
                    assert abs(mine - theirs) <= RELATIVE_ERROR * theirs + 1e-9


@given(
    start=st.none() | st.integers(-3600, int(SPAN.total_seconds())),
    length=st.none() | st.integers(1, int(SPAN.total_seconds())),
    by=st.sampled_from([None, "model"]),
    tenant=st.sampled_from(["acme", "other"]),
    order=st.none() | st.permutations(STEPS).map(lambda p: list(p[:3])),
)
def test_rollup_funnel_equals_the_raw_query_for_any_window(
    projector: Projector,
    start: int | None,
    length: int | None,
    by: str | None,
    tenant: str,
    order: list[str] | None,
) -> None:
    since = None if start is None else T0 + timedelta(seconds=start, milliseconds=start % 13)
    until = None if length is None else (since or T0) + timedelta(seconds=length)
    with projector.connect() as conn:
        reader = projector.names.reader
        window = {"tenant": tenant, "steps": order, "by": by, "since": since, "until": until}
        raw = funnel_report(conn, reader, "support", read="raw", **window)  # type: ignore[arg-type]
        rolled = funnel_report(conn, reader, "support", read="rollups", **window)  # type: ignore[arg-type]
    assert_same(raw, rolled)


def test_the_funnel_reads_rollups_for_long_windows_and_refuses_them_for_metadata(
    projector: Projector,
) -> None:
    with projector.connect() as conn:
        reader = projector.names.reader
        whole = funnel_report(conn, reader, "support", tenant="acme")
        exact = funnel_report(conn, reader, "support", tenant="acme", read="raw")
        assert [s.reached for s in whole[0].steps] == [s.reached for s in exact[0].steps]
        assert [s.p95_seconds for s in whole[0].steps] != [s.p95_seconds for s in exact[0].steps]
        with pytest.raises(ValidationError, match="no roll-up"):
            funnel_report(conn, reader, "support", tenant="acme", by="metadata.channel", read="rollups")
        by_channel = funnel_report(conn, reader, "support", tenant="acme", by="metadata.channel")
        assert sum(r.sessions for r in by_channel) == whole[0].sessions


def test_rollups_kept_batch_by_batch_equal_a_rebuild(projector: Projector) -> None:
    assert verify(projector, ["funnel"]) == []
