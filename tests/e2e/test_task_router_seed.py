"""The seed's task router end to end over REST: three teams, a hundred mixed tasks created
without skills, classified by the real LLM client against the built-in simulator, routed by
what the classification derived, swept for deadlines, requeued by a person and assigned."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.task_schemas import TierReportOut
from flowledger.adapters.llm.client import OpenAICompatibleClient
from flowledger.adapters.llm.pricing import load_price_table
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.values import plain_decimal
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

TEAMS = {
    "backend": ["python", "golang", "kubernetes"],
    "frontend": ["react", "vue", "css"],
    "devops": ["terraform", "aws", "docker"],
}
# (description, the category the simulator gives it, the team whose skills fit it)
TEMPLATES = [
    ("Fix the crash in the Go worker {n}", "bug_fix", "backend"),
    ("Fix the broken CSS layout of page {n}", "bug_fix", "frontend"),
    ("Document the React component {n}", "documentation", "frontend"),
    ("Review the Python endpoint {n}", "review", "backend"),
    ("Research autoscaling for the Go scheduler {n}", "research", "backend"),
    ("Build a Vue widget for board {n}", "feature", "frontend"),
    ("Rollout the Docker image {n}", "deployment", "devops"),
    ("Deploy bucket {n} with Terraform", "deployment", "devops"),
    ("Investigate the AWS bill of account {n}", "research", "devops"),
    ("Security outage: fix the Python service {n}", "bug_fix", "backend"),
]
PRIORITIES = ["low", "MEDIUM", "Medium", "high", "CRITICAL"]


@pytest.fixture(scope="module")
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=0, seed=14)) as running:
        yield running


@pytest.fixture(params=["memory", "postgres"])
def http(request: pytest.FixtureRequest, simulator: Any) -> Iterator[TestClient]:
    if request.param == "memory":
        settings = make_settings(database_url="memory:")
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"), schema=request.getfixturevalue("pg_schema")
        )
    settings = settings.with_overrides(llm_base_url=simulator.base_url, llm_api_key="sk-test-simulator")
    llm = OpenAICompatibleClient.from_settings(settings)
    with Engine(settings=settings, llm=llm) as engine, TestClient(create_app(engine)) as client:
        try:
            yield client
        finally:
            client.portal.call(llm.aclose)


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def test_the_seed_scenario_runs_over_rest(http: TestClient) -> None:
    # Given the seed's three teams at its default capacity, raised for a hundred tasks
    for agent_id, skills in TEAMS.items():
        agent = ok(
            http.post("/v1/agents", json={"agent_id": agent_id, "name": agent_id, "skills": skills}), 201
        )
        assert agent["capacity"] == 10
        assert ok(http.put(f"/v1/agents/{agent_id}/capacity", json={"capacity": 40}))["capacity"] == 40
    # and a hundred mixed tasks without skills, in mixed-case priorities; ten of them overdue
    past = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    expected: dict[str, tuple[str, str]] = {}
    created_priority: dict[str, str] = {}
    for n in range(100):
        description, category, team = TEMPLATES[n % len(TEMPLATES)]
        task = {"task_id": f"task_{n}", "description": description.format(n=n)}
        task["priority"] = PRIORITIES[(n // 10) % len(PRIORITIES)]
        if n % 10 == 3:
            task["deadline"] = past
        ok(http.post("/v1/tasks", json=task), 201)
        expected[task["task_id"]] = (category, team)
        created_priority[task["task_id"]] = task["priority"].lower()

    # When each is classified (the priority's tier picks the model)
    for task_id in expected:
        classified = ok(http.post(f"/v1/tasks/{task_id}/classify", json={}))
        assert classified["classification"]["category"] == expected[task_id][0]
        assert classified["required_skills"], task_id
    tiers = Counter(
        (created_priority[t["task_id"]], t["classification"]["usage"]["request_model"])
        for t in ok(http.get("/v1/tasks", params={"limit": 1000}))
    )
    # Then the critical and high ones ran on the premium tier, the rest on the budget ones
    assert set(tiers) == {
        ("critical", "claude-sonnet-4.5"),
        ("high", "claude-sonnet-4.5"),
        ("medium", "deepseek-v3.2"),
        ("low", "gemini-2.5-flash"),
    }
    # and "Security outage" tasks were raised to critical by their complexity
    raised = ok(http.get("/v1/tasks", params={"priority": "CRITICAL", "limit": 1000}))
    outages = {f"task_{n}" for n in range(9, 100, 10) if (n // 10) % len(PRIORITIES) != 4}
    assert len(outages) == 8
    assert {t["task_id"] for t in raised} >= outages

    # When the deadlines are swept, twice
    overdue = {f"task_{n}" for n in range(3, 100, 10)}
    assert {t["task_id"] for t in ok(http.get("/v1/tasks", params={"overdue": "true"}))} == overdue
    first = ok(http.post("/v1/queue/sweep"))
    second = ok(http.post("/v1/queue/sweep"))
    # Then the overdue ones were escalated once
    assert {t["task_id"] for t in first} == overdue
    assert second == []

    # When the queue runs
    ran = ok(http.post("/v1/queue/run", json={}))
    # Then every waiting task went to a team whose skills fit its category and words
    assert len(ran) == 90
    for task in ran:
        assert task["status"] == "assigned", task
        assert task["agent_id"] == expected[task["task_id"]][1], task
        assert set(task["required_skills"]) <= set(TEAMS[task["agent_id"]])
    loads = {a["agent_id"]: a["load"] for a in ok(http.get("/v1/agents"))}
    assert sum(loads.values()) == 90
    assert all(load <= 40 for load in loads.values())

    # When a person requeues the escalated ones with a new deadline, and the queue runs again
    for task_id in sorted(overdue):
        body = {"reason": "deadline moved", "requested_by": "lead@example.com", "deadline_hours": 24}
        assert ok(http.post(f"/v1/tasks/{task_id}/requeue", json=body))["status"] == "pending"
    again = ok(http.post("/v1/queue/run", json={}))
    # Then they are assigned, to fitting teams, and each history says who requeued it and why
    assert {t["task_id"] for t in again} == overdue
    assert all(t["agent_id"] == expected[t["task_id"]][1] for t in again)
    history = ok(http.get("/v1/tasks/task_3/history"))
    requeued = next(e for e in history if e["event_type"] == "Task.Requeued")
    assert requeued["data"]["requested_by"] == "lead@example.com"
    assert requeued["data"]["escalation_reason"] == "deadline_breached"
    assert [e["event_type"] for e in history].count("Task.Escalated") == 1
    assert ok(http.get("/v1/tasks", params={"agent_id": "devops", "status": "assigned", "limit": 1000}))


def test_router_refusals_use_the_api_error_shape_and_record_nothing(http: TestClient) -> None:
    ok(http.post("/v1/tasks", json={"task_id": "t", "description": "Fix the Go worker"}), 201)
    refused = http.post("/v1/tasks/t/classify", json={"model": "gpt-4.2-typo"})
    assert refused.status_code == 422
    assert refused.json() == {"success": False, "error": refused.json()["error"]}
    assert "gpt-4.2-typo" in refused.json()["error"]
    assert [e["event_type"] for e in ok(http.get("/v1/tasks/t/history"))] == ["Task.Created"]
    assert http.post("/v1/tasks/t/requeue", json={"reason": "x", "requested_by": "me"}).status_code == 409
    assert http.get("/v1/tasks", params={"status": "lost"}).status_code == 422
    assert http.get("/v1/tasks", params={"priority": "urgent"}).status_code == 422
    assert http.put("/v1/agents/nobody/capacity", json={"capacity": 3}).status_code == 404
    assert http.post("/v1/tasks/t/requeue", json={"reason": "x"}).json()["success"] is False


def test_a_task_completes_with_a_resolution_as_a_session_does(http: TestClient) -> None:
    ok(http.post("/v1/agents", json={"agent_id": "be", "name": "Backend", "skills": ["python"]}), 201)
    for task_id in ("new", "old"):
        body = {"task_id": task_id, "description": "Fix it", "required_skills": ["python"]}
        ok(http.post("/v1/tasks", json=body), 201)
        ok(http.post(f"/v1/tasks/{task_id}/assign"))
    done = ok(http.post("/v1/tasks/new/complete", json={"resolution": {"pr": 1}}))
    legacy = ok(http.post("/v1/tasks/old/complete", json={"result": {"pr": 2}}))
    assert (done["resolution"], legacy["resolution"]) == ({"pr": 1}, {"pr": 2})


def test_the_dashboard_reprices_recorded_task_calls_under_each_tier_policy(
    http: TestClient, request: pytest.FixtureRequest
) -> None:
    # Given tasks of every priority, classified on their tiers through the simulator
    created: dict[str, str] = {}
    for n, priority in enumerate(["low", "medium", "medium", "medium", "high", "critical"] * 2):
        created[f"t{n}"] = priority
        ok(
            http.post(
                "/v1/tasks",
                json={"task_id": f"t{n}", "description": f"Fix the Go worker {n}", "priority": priority},
            ),
            201,
        )
        ok(http.post(f"/v1/tasks/t{n}/classify", json={}))
    report = http.get("/v1/dashboard/tiers", params={"since": "1h"})
    if "memory" in request.node.callspec.id:
        # The read models live in PostgreSQL only: an in-memory engine says so in the error shape
        assert report.status_code == 422
        assert report.json()["success"] is False
        return
    body = ok(report)

    # Then each policy's cost is each call's tokens priced at the tier model of the priority
    # the task had when it was classified (its creator's: a classification may raise it after)
    prices = load_price_table()
    tasks = {t["task_id"]: t for t in ok(http.get("/v1/tasks", params={"limit": 1000}))}
    usages = [(created[task_id], t["classification"]["usage"]) for task_id, t in tasks.items()]
    assert body["calls"] == len(usages) == 12
    assert Decimal(body["recorded_cost_usd"]) == sum(Decimal(u["cost_usd"]) for _, u in usages)
    policies = {p["policy"]: p for p in body["policies"]}
    premium = {p: "claude-sonnet-4.5" for p in ("low", "medium", "high", "critical")}
    mixed = {
        "critical": "claude-sonnet-4.5",
        "high": "claude-sonnet-4.5",
        "medium": "deepseek-v3.2",
        "low": "gemini-2.5-flash",
    }
    for name, models in (("all claude-sonnet-4.5", premium), ("configured", mixed)):
        expected = sum(
            prices.price_for(models[priority]).cost(
                input_tokens=u["input_tokens"],
                output_tokens=u["output_tokens"],
                cache_read_input_tokens=u["cache_read_input_tokens"],
                reasoning_output_tokens=u["reasoning_output_tokens"],
            )
            for priority, u in usages
        )
        assert Decimal(policies[name]["cost_usd"]) == expected, name
    # and the configured policy, which routed the calls, reprices to what they cost
    assert Decimal(policies["configured"]["cost_usd"]) == Decimal(body["recorded_cost_usd"])
    # and the mixed policy's saving against Claude alone is measured, not assumed
    base, mixed_cost = (Decimal(policies[n]["cost_usd"]) for n in ("all claude-sonnet-4.5", "configured"))
    assert Decimal(policies["configured"]["saving_pct"]) == ((base - mixed_cost) / base * 100).quantize(
        Decimal("0.1")
    )
    assert 0 < Decimal(policies["configured"]["saving_pct"]) < 100


def test_the_dashboard_page_shows_the_tier_what_if_the_json_gives(
    http: TestClient, request: pytest.FixtureRequest
) -> None:
    # The document names the what-if's shape (it was an untyped object)
    document = ok(http.get("/openapi.json"))["paths"]["/v1/dashboard/tiers"]["get"]
    assert document["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TierReportOut"
    }
    if "memory" in request.node.callspec.id:
        # The read models live in PostgreSQL only: the page says so, as the JSON does
        assert http.get("/dashboard", params={"since": "1h"}).status_code == 422
        return
    # Given an empty window: the page has no tier panel
    empty = http.get("/dashboard", params={"since": "1h"})
    assert empty.status_code == 200, empty.text
    assert "model tiers: what if" not in empty.text
    # and tasks of every priority classified on their tiers through the simulator
    for n, priority in enumerate(["low", "medium", "high", "critical"]):
        task = {"task_id": f"t{n}", "description": f"Fix the Go worker {n}", "priority": priority}
        ok(http.post("/v1/tasks", json=task), 201)
        ok(http.post(f"/v1/tasks/t{n}/classify", json={}))
    body = ok(http.get("/v1/dashboard/tiers", params={"since": "1h"}))
    TierReportOut.model_validate(body)  # the shape the document names, no field more or less
    # When the dashboard page is opened
    page = http.get("/dashboard", params={"since": "1h"})
    assert page.status_code == 200, page.text
    # Then it shows the what-if the JSON gives: each policy's models, cost and saving
    panel = page.text[page.text.index("model tiers: what if") :]
    assert (
        f"{body['calls']:,} task calls recorded at ${plain_decimal(Decimal(body['recorded_cost_usd']))}"
        in panel
    )
    assert "saving against all claude-sonnet-4.5" in panel
    for policy in body["policies"]:
        models = "".join(f"<td>{policy['models'][p]}</td>" for p in ("critical", "high", "medium", "low"))
        cells = f"<td>{policy['policy']}</td>{models}<td>${plain_decimal(Decimal(policy['cost_usd']))}</td>"
        assert f"<tr>{cells}<td>{policy['saving_pct']}%</td></tr>" in panel, policy
