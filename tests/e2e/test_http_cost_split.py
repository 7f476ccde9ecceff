"""The dashboard (JSON and page) splits successful steps' cost from failed and retried attempts,
and marks unpriced calls instead of counting them as $0."""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.charts import LABEL_CHARS
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine


def usage(model: str, cost: str, **fields: Any) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal(cost),
        latency_ms=20.0,
        **fields,
    )


@pytest.fixture
def http(pg_engine: Engine) -> Iterator[TestClient]:
    pg_engine.start_session("s-1", "cs")
    # An answer after one billed retry, a plain answer, then a failed call and an unpriced one
    pg_engine.record_step("s-1", "a", usage=usage("gpt-4.1", "0.0030", retried_cost_usd=Decimal("0.0020")))
    pg_engine.record_step("s-1", "b", usage=usage("gpt-4.1", "0.0010"))
    failed = usage("gpt-4.1", "0.0005")
    pg_engine.store.write(
        "s-1",
        lambda uow: uow.find(pg_engine.session_uuid("s-1")).fail_step(
            step="c", error_type="malformed_response", error_message="no choices", usage=failed
        ),
    )
    pg_engine.record_step("s-1", "d", usage=usage("mystery-1", "0", unpriced=True))
    with TestClient(create_app(pg_engine)) as client:
        yield client


def test_the_dashboard_json_splits_successful_retried_and_failed_cost(http: TestClient) -> None:
    rows = {tuple(r["group"]): r for r in http.get("/v1/dashboard", params={"by": "model"}).json()}
    gpt = rows[("gpt-4.1",)]
    assert (gpt["succeeded_cost_usd"], gpt["retried_cost_usd"], gpt["failed_cost_usd"]) == (
        "0.0040",
        "0.0020",
        "0.0005",
    )
    assert gpt["cost_usd"] == "0.0065"
    assert (gpt["unpriced_calls"], rows[("mystery-1",)]["unpriced_calls"]) == (0, 1)


def test_the_dashboard_page_shows_the_split_and_marks_unpriced_calls(http: TestClient) -> None:
    page = http.get("/dashboard").text
    assert "cost of successful steps vs failed and retried attempts" in page
    assert "retried attempts: $0.0020" in page
    assert "\u2068mystery-1\u2069 (unpriced: 1)" in page  # the name isolated (charts.isolated)
    assert "unpriced calls: no price known, not $0" in page


LONG = "openrouter/anthropic/claude-sonnet-4.5-20250929-experimental"


def test_a_long_priced_model_name_is_cut_to_fit_in_every_chart(pg_engine: Engine) -> None:
    # Given a priced model with a long name (an unpriced one's is cut before its mark)
    pg_engine.start_session("s-long", "cs")
    pg_engine.record_step("s-long", "a", usage=usage(LONG, "0.0030"))
    with TestClient(create_app(pg_engine)) as client:
        page = client.get("/dashboard").text
    # When each chart's label of it is read (title on hover, text shown)
    labels = re.findall(r'text-anchor="end"><title>([^<]*)</title>([^<]*)</text>', page)
    shown = [text for title, text in labels if title == LONG]
    # Then the cost charts cut it as the latency chart does (right-aligned in 150 px, the whole
    # name ran off each cost chart's left edge, its start unreadable), the whole name on hover
    assert len(shown) == 3, labels
    assert shown == [LONG[: LABEL_CHARS - 1] + "…"] * 3
