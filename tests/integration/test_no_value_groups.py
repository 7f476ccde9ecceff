"""Calls with no model, and sessions without a breakdown's value, are a group of their own: a
model (or metadata value) literally named ``(none)`` was merged with them, in the dashboard
and the funnel alike, raw rows and roll-ups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, dashboard, funnel_report, projector_for
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
NAMED = "(none)"


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def usage(model: str) -> LlmUsage:
    return LlmUsage(
        provider=NAMED,
        request_model=model,
        response_model=model,
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal("0.5"),
        latency_ms=100.0,
    )


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    # A session on a model named "(none)", one whose only call failed before any usage (no
    # model), one with no model call at all; metadata "(none)" on one, no channel on the others
    named = SessionScript("named", "wf", at(0), metadata={"channel": NAMED})
    named.step("classify", at(10), usage=usage(NAMED))
    failed = SessionScript("failed", "wf", at(5)).fail("classify", at(20), "RuntimeError")
    plain = SessionScript("plain", "wf", at(6)).step("classify", at(30))
    append(pg_engine.log, interleave([named, failed, plain]))
    projector = projector_for(pg_engine, batch_size=2)
    projector.catch_up()
    return projector


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_a_model_named_none_is_not_merged_with_calls_without_a_model(projector: Projector, read: str) -> None:
    with projector.connect() as conn:
        rows = dashboard(
            conn, projector.names.reader, tenant="default", since=T0, by=["model", "provider"], read=read
        )
    groups = {r.group: (r.calls, r.errors_by_type, r.cost_usd) for r in rows}
    assert groups == {
        (NAMED, NAMED): (1, {}, Decimal("0.5")),
        (None, None): (1, {"RuntimeError": 1}, Decimal(0)),
    }


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_the_funnel_by_model_keeps_a_model_named_none_apart_from_sessions_without_one(
    projector: Projector, read: str
) -> None:
    with projector.connect() as conn:
        reports = funnel_report(conn, projector.names.reader, "wf", tenant="default", by="model", read=read)
    assert [(r.segment, r.sessions) for r in reports] == [(None, 2), (NAMED, 1)]


def test_the_funnel_by_metadata_keeps_a_value_named_none_apart_from_sessions_without_it(
    projector: Projector,
) -> None:
    with projector.connect() as conn:
        reports = funnel_report(conn, projector.names.reader, "wf", tenant="default", by="metadata.channel")
    assert [(r.segment, r.sessions) for r in reports] == [(None, 2), (NAMED, 1)]
