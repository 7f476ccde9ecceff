"""A latency stored past the input bound (an older release took any finite number) must not
take the whole dashboard down: its group is shown, finite, beside every other."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.history import jsonable
from flowledger.projections import dashboard, projector_for
from flowledger.projections.latency_sketch import RELATIVE_ERROR
from tests.support.synthetic import SessionScript, append

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


def usage(model: str, latency_ms: float) -> LlmUsage:
    return LlmUsage(
        request_model=model, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=latency_ms
    )


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_latencies_near_the_largest_float_leave_every_group_of_the_dashboard_readable(
    pg_engine: Engine, read: str
) -> None:
    # Given two calls whose stored latencies are near the largest float (1e308 and 1.7e308 ms,
    # appended past validation) and an ordinary call of another model
    script = SessionScript("huge", "flow", T0)
    script.step("a", T0 + timedelta(seconds=1), usage=usage("huge-model", 1e308))
    script.step("b", T0 + timedelta(seconds=2), usage=usage("huge-model", 1.7e308))
    script.step("c", T0 + timedelta(seconds=3), usage=usage("plain-model", 250.0))
    append(pg_engine.log, script.events)
    projector = projector_for(pg_engine)
    projector.catch_up()
    # When the dashboard is read by model
    with projector.connect() as conn:
        rows = dashboard(conn, projector.names.reader, tenant="default", since=T0, by=["model"], read=read)
    # Then both groups are there (the sum of the two latencies overflowed a float: the raw
    # read failed with "value out of range: overflow" for every model, and the roll-ups gave a
    # p99 of NaN, which the JSON answer could not carry: a 500)
    by_model = {r.group[0]: r for r in rows}
    assert set(by_model) == {"huge-model", "plain-model"}
    assert by_model["plain-model"].latency_p50_ms == pytest.approx(250.0, rel=RELATIVE_ERROR)
    huge = by_model["huge-model"]
    assert huge.latency_avg_ms == pytest.approx(1.35e308)
    exact_p99 = 1e308 + 0.99 * 0.7e308
    for value, exact in ((huge.latency_p50_ms, 1.35e308), (huge.latency_p99_ms, exact_p99)):
        assert value is not None
        assert math.isfinite(value)
        assert value == pytest.approx(exact, rel=RELATIVE_ERROR + 1e-12)
    json.dumps(jsonable([huge.__dict__]), allow_nan=False)  # what the HTTP answer sends
