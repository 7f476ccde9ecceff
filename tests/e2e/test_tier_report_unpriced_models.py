"""The tier what-if when a routing tier names a model the price table cannot price.

With ``FLOWLEDGER_LLM_UNPRICED_MODELS=flag`` such a routing file is taken at start-up (its calls
are made and flagged ``unpriced``), so the what-if meets a policy it cannot price. It answered
``422 routing: no price for ['llama-3.3-70b'] ...`` as soon as one task call was recorded, on
any priority: ``GET /v1/dashboard/tiers`` blamed its caller for the server's configuration, and
the whole ``/dashboard`` page (sessions' costs included) was a 422. Now the policies that need
that price say so (``cost_usd`` null, ``unpriced_models``) and every other is priced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.task_schemas import TierReportOut
from flowledger.adapters.llm.client import OpenAICompatibleClient
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

ROUTING = {
    "version": "unpriced-low",
    "tiers": {
        "critical": ["claude-sonnet-4.5"],
        "high": ["claude-sonnet-4.5"],
        "medium": ["deepseek-v3.2"],
        "low": ["llama-3.3-70b"],
    },
    "fallback": ["deepseek-v3.2"],
}


@pytest.fixture
def http(database_url: str, pg_schema: str, tmp_path: Path) -> Iterator[TestClient]:
    routing = tmp_path / "routing.json"
    routing.write_text(json.dumps(ROUTING))
    with run_simulator(SimulatorConfig(latency_ms=0, seed=3)) as simulator:
        settings = make_settings(database_url=database_url, schema=pg_schema).with_overrides(
            llm_base_url=simulator.base_url, llm_api_key="sk-test-simulator", routing_file=routing
        )
        llm = OpenAICompatibleClient.from_settings(settings, unpriced_models="flag")
        with Engine(settings=settings, llm=llm) as engine, TestClient(create_app(engine)) as client:
            try:
                yield client
            finally:
                client.portal.call(llm.aclose)


def ok(response: Any) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def test_a_tier_on_an_unpriced_model_leaves_the_what_if_answered_and_the_page_open(
    http: TestClient,
) -> None:
    # Given a medium task classified on deepseek-v3.2 and a low one on the unpriced model
    for task_id, priority in (("t-medium", "medium"), ("t-low", "low")):
        task = {"task_id": task_id, "description": "Fix the Go worker", "priority": priority}
        assert http.post("/v1/tasks", json=task).status_code == 201
        ok(http.post(f"/v1/tasks/{task_id}/classify"))

    # When the what-if is asked for
    body = ok(http.get("/v1/dashboard/tiers", params={"since": "1h"}))

    # Then every policy is there: those pricing a call at the unpriced model say so
    TierReportOut.model_validate(body)
    assert body["calls_by_priority"] == {"low": 1, "medium": 1}
    policies = {p["policy"]: p for p in body["policies"]}
    for name in ("configured", "all llama-3.3-70b"):
        assert policies[name]["cost_usd"] is None, name
        assert policies[name]["saving_pct"] is None, name
        assert policies[name]["unpriced_models"] == ["llama-3.3-70b"], name
    assert policies["configured"]["models"] == {"low": "llama-3.3-70b", "medium": "deepseek-v3.2"}
    # and the others are priced, with their saving against the premium model alone
    for name in ("all claude-sonnet-4.5", "all deepseek-v3.2"):
        assert float(policies[name]["cost_usd"]) > 0, name
        assert policies[name]["unpriced_models"] == [], name
    assert float(policies["all deepseek-v3.2"]["saving_pct"]) > 0
    # and the dashboard page opens, its panel saying which policies have no price
    page = http.get("/dashboard", params={"since": "1h"})
    assert page.status_code == 200, page.text
    panel = page.text[page.text.index("model tiers: what if") :]
    assert "<td>no price for llama-3.3-70b</td>" in panel
