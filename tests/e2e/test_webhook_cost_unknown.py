"""The webhook says when a step's cost is not known, instead of answering it as a known $0."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        yield engine


def _step(engine: Engine, http: TestClient, session_id: str) -> tuple[dict[str, object], dict[str, object]]:
    """Process one step over the webhook; its ai_metrics, and the step's get_state entry."""
    body = {"action": "create_session", "session_id": session_id, "workflow_name": "customer_service"}
    assert http.post("/webhook/workflow-state", json=body).status_code == 200
    body = {"action": "process_step", "session_id": session_id, "step_name": "classify_intent"}
    answer = http.post("/webhook/workflow-state", json=body).json()["data"]
    body = {"action": "get_state", "session_id": session_id}
    [entry] = http.post("/webhook/workflow-state", json=body).json()["data"]["history"]
    return answer["ai_metrics"], entry


def test_a_step_whose_cost_is_not_known_says_so_and_a_priced_one_keeps_the_seeds_fields(
    engine: Engine,
) -> None:
    # An endpoint that left usage out (or a proxy's page before a retried answer): the webhook
    # answered "cost_usd": 0.0 and "ai_cost": 0.0, a silent $0, where REST's usage says unpriced.
    unknown = replace(USAGE, input_tokens=0, output_tokens=0, cost_usd=USAGE.cost_usd * 0, unpriced=True)
    unknown = replace(unknown, billed_unreported=True, extra={"usage_reported": False})
    with TestClient(create_app(engine, require_keys=False)) as http:
        engine.llm = ScriptedLlm(usage=unknown)
        metrics, entry = _step(engine, http, "s-unknown")
        assert (metrics["cost_usd"], metrics["unpriced"]) == (0.0, True)
        assert (entry["ai_cost"], entry["unpriced"]) == (0.0, True)
        # A priced step answers the seed's fields as they were, nothing added
        engine.llm = ScriptedLlm()
        metrics, entry = _step(engine, http, "s-priced")
        assert set(metrics) == {"model", "tokens", "cost_usd", "latency_ms"}
        assert set(entry) == {"step", "timestamp", "ai_cost"}
