"""Budgets cover the task router's model calls as they cover steps: a classification, its
fallback and a model-ranked tie-break reserve their estimate before the call (refused unsent,
the task left as it was: BudgetExceeded, HTTP 402, CLI exit 8) and settle their cost after it.

Budgets need PostgreSQL (the in-memory engine has no ledger), so these tests run there only.
(An outside probe: under an enforced $0.0000001 budget on claude-sonnet-4.5, ``POST
/v1/tasks/BG-1/classify`` called claude-sonnet-4.5, and ``budgets list`` still showed $0 spent.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.simulator import Simulator, SimulatorConfig, run_simulator
from flowledger.domain.budget import Budget, budget_uuid
from flowledger.domain.errors import BudgetExceeded
from flowledger.domain.task_views import TaskStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli
from tests.support.llm import ScriptedLlm
from tests.support.ranking import ranked_routing
from tests.support.simulated import simulated_client

pytestmark = pytest.mark.postgres
TIER_MODEL = "claude-sonnet-4.5"
"""The model of the high and critical tiers (the routing's fallback is deepseek-v3.2)."""
NOTHING = "0.0000001"
"""A limit no call fits in."""


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with run_simulator(SimulatorConfig(latency_ms=5, seed=11)) as running:
        yield running


@pytest.fixture
def routing(tmp_path: Path) -> Path:
    return ranked_routing(tmp_path)


def engine_for(database_url: str, schema: str, routing: Path, llm: Any) -> Engine:
    return Engine(
        settings=make_settings(database_url=database_url, schema=schema, routing_file=routing), llm=llm
    )


@pytest.fixture
def routed(database_url: str, pg_schema: str, routing: Path, simulator: Simulator) -> Iterator[Engine]:
    """An engine with the real client against the simulator, model ranking on."""
    engine = engine_for(database_url, pg_schema, routing, simulated_client(simulator.base_url))
    try:
        yield engine
    finally:
        engine.close()


def spent(engine: Engine) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    """Each budget's (spent, reserved) by (scope, subject)."""
    return {(b.spec.scope, b.spec.subject): (b.spent_usd, b.reserved_usd) for b in engine.budgets.burn()}


def no_holds(engine: Engine) -> bool:
    ledger = engine.budgets._ledger
    assert ledger is not None
    return ledger.open_reservations() == 0


def kinds(engine: Engine, task_id: str) -> list[str]:
    return [e.event_type for e in engine.task_history(task_id)]


async def test_a_budget_refuses_a_classification_before_the_call_and_the_fallback_is_not_tried(
    routed: Engine, simulator: Simulator
) -> None:
    # Given an enforced budget no call fits in, on the high tier's model
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    routed.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
    # When the task is classified, or reclassified
    for classify in (routed.classify_task, routed.reclassify_task):
        with pytest.raises(BudgetExceeded) as refused:
            await classify("BG-1")
        assert f"budget model:{TIER_MODEL} per day would be exceeded" in str(refused.value)
    # Then no request was sent (not to the fallback either, which no budget limits), nothing
    # was appended to the task (it is not held back), and nothing is spent or held
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-1") == ["Task.Created"]
    task = routed.get_task("BG-1")
    assert (task.status, task.classification, task.held_back) == (TaskStatus.PENDING, None, None)
    assert spent(routed) == {("model", TIER_MODEL): (Decimal(0), Decimal(0))}
    assert no_holds(routed)
    # And a model the caller names that no budget limits is classified
    state = await routed.classify_task("BG-1", model="deepseek-v3.2")
    assert state.classification is not None
    assert simulator.stats["requests"] == 1


async def test_a_classification_within_budget_is_settled_at_its_cost(
    routed: Engine, simulator: Simulator
) -> None:
    # Given a tenant budget and a budget on the tier's model that a call fits in
    routed.budgets.set("tenant", None, "day", "1")
    routed.budgets.set("model", TIER_MODEL, "month", "1")
    routed.budgets.set("model", "gemini-2.5-flash", "month", "1")  # another model's: not charged
    routed.budgets.set("workflow", "support", "month", "1")  # no workflow's: not charged
    routed.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
    # When it is classified
    state = await routed.classify_task("BG-1")
    # Then the call's cost is spent in the budgets it is charged to, and nothing stays held
    assert state.classification is not None
    usage = state.classification.usage
    assert usage is not None
    assert usage.request_model == TIER_MODEL
    assert usage.charged_usd > 0
    assert spent(routed) == {
        ("tenant", routed.tenant): (usage.charged_usd, Decimal(0)),
        ("model", TIER_MODEL): (usage.charged_usd, Decimal(0)),
        ("model", "gemini-2.5-flash"): (Decimal(0), Decimal(0)),
        ("workflow", "support"): (Decimal(0), Decimal(0)),
    }
    assert no_holds(routed)
    assert simulator.stats["requests"] == 1


async def test_a_classification_raises_alerts_as_a_step_does(routed: Engine) -> None:
    routed.budgets.set("tenant", None, "day", NOTHING, mode="alert")
    routed.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
    state = await routed.classify_task("BG-1")  # alert mode refuses nothing
    assert state.classification is not None
    budget_id = budget_uuid(routed.tenant, "tenant", routed.tenant, "day")
    raised = [e.threshold for e in routed.store.events(budget_id) if isinstance(e, Budget.AlertRaised)]
    assert raised == [50, 80, 100]


def scripted_endpoint(requests: list[str]) -> OpenAICompatibleClient:
    """The real client against an endpoint whose tier model (claude) answers what is not a
    classification and whose other models answer one; each request's model kept in ``requests``."""

    def handler(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        requests.append(model)
        content = (
            "no idea"
            if model == TIER_MODEL
            else json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})
        )
        usage = {"prompt_tokens": 300, "completion_tokens": 40, "total_tokens": 340}
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        return httpx.Response(200, json={"id": "c", "model": model, "choices": [choice], "usage": usage})

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-budget-1"), max_retries=0)
    return OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(handler))


def charged(entries: list[Any]) -> Decimal:
    total = Decimal(0)
    for entry in entries:
        usage = entry.data.get("usage")
        if isinstance(usage, LlmUsage):
            total += usage.charged_usd
    return total


async def test_a_fallback_a_budget_refuses_is_not_called_and_the_failure_before_it_says_so(
    database_url: str, pg_schema: str, routing: Path
) -> None:
    requests: list[str] = []
    engine = engine_for(database_url, pg_schema, routing, scripted_endpoint(requests))
    try:
        # Given a tier model that fails, and a fallback model under a budget no call fits in
        engine.budgets.set("model", "deepseek-v3.2", "day", NOTHING)
        engine.budgets.set("tenant", None, "day", "1", mode="alert")
        engine.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
        # When the task is classified
        with pytest.raises(BudgetExceeded):
            await engine.classify_task("BG-1")
        # Then the tier model's paid failure is recorded, naming no fallback tried and why;
        # the fallback was not called; the failure's cost is spent, nothing is held
        assert requests == [TIER_MODEL]
        history = engine.task_history("BG-1")
        assert [e.event_type for e in history] == ["Task.Created", "Task.ClassificationFailed"]
        failed = history[-1].data
        assert (failed["model"], failed["fallback"]) == (TIER_MODEL, None)
        assert "fallback deepseek-v3.2 not tried" in failed["detail"]
        assert "budget model:deepseek-v3.2 per day would be exceeded" in failed["detail"]
        burn = spent(engine)
        assert burn[("tenant", engine.tenant)] == (charged(history), Decimal(0))
        assert charged(history) > 0
        assert burn[("model", "deepseek-v3.2")] == (Decimal(0), Decimal(0))
        assert no_holds(engine)

        # When the fallback's budget can take it, and the task is reclassified
        engine.budgets.set("model", "deepseek-v3.2", "day", "1")
        state = await engine.reclassify_task("BG-1")
        # Then the fallback classified it, and both calls' costs are spent
        assert requests == [TIER_MODEL, TIER_MODEL, "deepseek-v3.2"]
        assert state.classification is not None
        history = engine.task_history("BG-1")
        burn = spent(engine)
        assert burn[("tenant", engine.tenant)] == (charged(history), Decimal(0))
        assert burn[("model", "deepseek-v3.2")] == (charged(history[-1:]), Decimal(0))
        assert no_holds(engine)
    finally:
        await engine.aclose()


def tied(engine: Engine) -> None:
    """Two agents the rule cannot tell apart, and a high task both can take."""
    engine.register_agent("ann", "Ann", ["golang"], 5)
    engine.register_agent("bob", "Bob", ["golang"], 5)
    engine.create_task("BG-2", "Fix the Go worker's kubernetes probe", ["golang"], "high")


async def test_a_budget_refuses_a_ranking_call_before_it_is_made_and_settles_one_within_it(
    routed: Engine, simulator: Simulator
) -> None:
    # Given a tie the model would break, under a budget no call fits in
    tied(routed)
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    # When the task is assigned through the ranking path
    with pytest.raises(BudgetExceeded):
        await routed.assign_task_ranked("BG-2")
    # Then no request went out, and the task waits as it was
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-2") == ["Task.Created"]
    assert routed.get_task("BG-2").status is TaskStatus.PENDING
    assert no_holds(routed)

    # When the budget can take the call
    routed.budgets.set("model", TIER_MODEL, "day", "1")
    state = await routed.assign_task_ranked("BG-2")
    # Then the model ranked, and its cost is spent in the budget
    assert state.status is TaskStatus.ASSIGNED
    assert simulator.stats["requests"] == 1
    assigned = routed.task_history("BG-2")[-1]
    assert assigned.event_type == "Task.Assigned"
    usage = assigned.data["usage"]
    assert isinstance(usage, LlmUsage)
    assert usage.charged_usd > 0
    assert spent(routed) == {("model", TIER_MODEL): (usage.charged_usd, Decimal(0))}
    assert no_holds(routed)


def test_over_http_a_refused_task_call_is_402_and_documented(routed: Engine, simulator: Simulator) -> None:
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    routed.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
    tied(routed)
    with TestClient(create_app(routed)) as http:
        for path in ("/v1/tasks/BG-1/classify", "/v1/tasks/BG-1/reclassify", "/v1/tasks/BG-2/assign"):
            answer = http.post(path)
            assert answer.status_code == 402, (path, answer.text)
            assert answer.json() == {"success": False, "error": answer.json()["error"]}
            assert f"budget model:{TIER_MODEL} per day would be exceeded" in answer.json()["error"]
        paths = http.get("/openapi.json").json()["paths"]
        for path in (
            "/v1/tasks/{task_id}/classify",
            "/v1/tasks/{task_id}/reclassify",
            "/v1/tasks/{task_id}/assign",
        ):
            assert "402" in paths[path]["post"]["responses"], path
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-1") == ["Task.Created"]
    assert kinds(routed, "BG-2") == ["Task.Created"]


def test_the_cli_exits_8_when_a_budget_refuses_a_classification(
    database_url: str, pg_schema: str, routed: Engine, simulator: Simulator
) -> None:
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    routed.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
    model = {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-test-simulator"}
    refused = run_cli(database_url, pg_schema, "tasks", "classify", "BG-1", env=model)
    assert refused.returncode == 8, refused.stderr
    assert f"budget model:{TIER_MODEL} per day would be exceeded" in refused.stderr
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-1") == ["Task.Created"]


async def test_a_classification_cancelled_during_its_call_lets_its_hold_go(
    database_url: str, pg_schema: str, routing: Path
) -> None:
    # Given a classification under a budget, whose model call is held open
    gate = asyncio.Event()
    reply = json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})
    llm = ScriptedLlm(reply, gate=gate)
    engine = engine_for(database_url, pg_schema, routing, llm)
    try:
        engine.budgets.set("tenant", None, "day", "1")
        engine.create_task("BG-1", "Fix the race in the Go worker pool", [], "high")
        call = asyncio.ensure_future(engine.classify_task("BG-1"))
        for _ in range(500):
            if llm.calls:
                break
            await asyncio.sleep(0.01)
        assert not no_holds(engine)  # held while the call runs
        # When its caller is cancelled mid-call
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Then nothing is held or spent, and the task is as it was
        assert no_holds(engine)
        assert spent(engine) == {("tenant", engine.tenant): (Decimal(0), Decimal(0))}
        assert kinds(engine, "BG-1") == ["Task.Created"]
    finally:
        await engine.aclose()


def test_a_queue_run_a_budget_stops_answers_402_and_its_openapi_entry_lists_it(
    routed: Engine, simulator: Simulator
) -> None:
    # Given an enforced budget no call fits in, on the high tier's model, and a high task that
    # names no skills (a queue run classifies it first)
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    routed.register_agent("backend", "Backend", ["golang"], capacity=1)
    routed.create_task("BG-Q", "Fix the race in the Go worker pool", [], "high")

    # When the queue runs over REST
    with TestClient(create_app(routed)) as client:
        answer = client.post("/v1/queue/run")
        documented = client.get("/openapi.json").json()["paths"]["/v1/queue/run"]["post"]["responses"]

    # Then the budget's refusal is the answer, nothing was sent or appended, and the API's
    # document lists that answer for the operation
    assert answer.status_code == 402, answer.text
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-Q") == ["Task.Created"]
    assert "402" in documented


def test_a_queue_run_a_budget_stops_still_places_the_tasks_that_need_no_model(
    routed: Engine, simulator: Simulator
) -> None:
    # Given an enforced budget no call fits in on the high tier's model, a high task that names
    # no skills (it needs the model first) and one that names its skills
    routed.budgets.set("model", TIER_MODEL, "day", NOTHING)
    routed.register_agent("backend", "Backend", ["golang"], capacity=2)
    routed.create_task("BG-Q", "Fix the race in the Go worker pool", [], "high")
    routed.create_task("BG-N", "Fix the race in the Go worker pool", ["golang"], "high")

    # When the queue runs over REST (it answered 402 and placed nothing until the budget's
    # window ended)
    with TestClient(create_app(routed)) as client:
        answer = client.post("/v1/queue/run")

    # Then the task naming its skills is assigned; the other waits as it was, nothing sent
    assert answer.status_code == 200, answer.text
    assert [(t["task_id"], t["agent_id"]) for t in answer.json()] == [("BG-Q", None), ("BG-N", "backend")]
    assert "this run's classifications were refused" in answer.json()[0]["held_back"]  # and says why
    assert simulator.stats["requests"] == 0
    assert kinds(routed, "BG-Q") == ["Task.Created"]
