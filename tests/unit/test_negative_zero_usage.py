"""A cost or a latency of negative zero is zero: recorded and answered without its sign. A step
recorded over REST with ``"cost_usd": -0.0`` (a JSON number: the string ``"-0"`` is refused,
it has a sign) answered and stored the cost ``"-0.0"``, and a library caller's ``Decimal("-0")``
was kept so, while every sum of it read ``0``."""

from __future__ import annotations

import math
from decimal import Decimal

from fastapi.testclient import TestClient

from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine


def test_a_usage_of_negative_zero_cost_and_latency_holds_zeros_without_a_sign() -> None:
    usage = LlmUsage(cost_usd=Decimal("-0.00"), retried_cost_usd=Decimal("-0"), latency_ms=-0.0)
    assert not usage.cost_usd.is_signed()
    assert not usage.retried_cost_usd.is_signed()
    assert math.copysign(1.0, usage.latency_ms) == 1.0
    assert usage.to_dict()["cost_usd"] == "0.00"
    assert usage.to_dict()["latency_ms"] == 0.0


def test_a_step_recorded_with_negative_zero_answers_and_reads_back_zero(engine: Engine) -> None:
    # Given a step whose usage a caller gave as negative zeros
    engine.start_session("s", "wf")
    used = LlmUsage(request_model="m", cost_usd=Decimal("-0"), latency_ms=-0.0, input_tokens=1)
    # When it is recorded and read back from the log
    record = engine.record_step("s", "step", usage=used)
    read = engine.session_steps("s")[0]
    # Then both hold the cost 0, unsigned
    for usage in (record.usage, read.usage):
        assert usage is not None
        assert str(usage.cost_usd) == "0"
        assert math.copysign(1.0, usage.latency_ms) == 1.0


def test_a_rest_step_with_a_cost_of_negative_zero_answers_zero(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s", "workflow": "wf"}).status_code == 201
    answer = memory_http.post(
        "/v1/sessions/s/steps",
        content=b'{"step": "a", "usage": {"request_model": "m", "cost_usd": -0.0, "latency_ms": -0.0}}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["usage"]["cost_usd"] == "0.0"
    assert '"latency_ms":-0.0' not in answer.text
