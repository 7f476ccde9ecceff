"""The tasks-and-agents REST API, on both backends; tasks are classified by the real client
against the built-in simulator."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.support.simulated import list_cost
from tests.support.simulated_http import simulated_http


@pytest.fixture(params=["memory", "postgres"])
def http(request: pytest.FixtureRequest, simulator: Simulator) -> Iterator[TestClient]:
    yield from simulated_http(request, simulator)


def test_a_task_is_classified_assigned_worked_and_completed(http: TestClient, simulator: Simulator) -> None:
    agent = {"agent_id": "be-1", "name": "Backend 1", "skills": ["golang"], "capacity": 1}
    assert http.post("/v1/agents", json=agent).status_code == 201
    task = {
        "task_id": "T-1",
        "description": "Fix the race",
        "required_skills": ["golang"],
        "priority": "critical",
        "deadline_hours": 4,
    }
    assert http.post("/v1/tasks", json=task).status_code == 201

    classified = http.post("/v1/tasks/T-1/classify", json={}).json()
    # The simulator reads a race to fix as a high-complexity bug fix; a critical task is
    # classified on its tier's model, and the call cost the simulator's usage at that
    # model's list price, through the real client's pricing
    assert classified["classification"]["category"] == "bug_fix"
    assert classified["classification"]["complexity"] == "high"
    exchange = simulator.exchanges[-1]
    assert "Fix the race" in exchange.messages[-1]["content"]
    assert exchange.model == "claude-sonnet-4.5"
    usage = classified["classification"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        exchange.reply["usage"]["prompt_tokens"],
        exchange.reply["usage"]["completion_tokens"],
    )
    assert Decimal(usage["cost_usd"]) == list_cost(exchange.reply)
    assigned = http.post("/v1/tasks/T-1/assign").json()
    assert assigned["agent_id"] == "be-1"
    assert http.get("/v1/agents/be-1").json()["load"] == 1
    http.post("/v1/tasks/T-1/start")
    done = http.post("/v1/tasks/T-1/complete", json={"result": {"pr": 42}}).json()
    assert done["status"] == "completed"
    assert http.get("/v1/agents/be-1").json()["load"] == 0
    events = [e["event_type"] for e in http.get("/v1/tasks/T-1/history").json()]
    assert events == ["Task.Created", "Task.Classified", "Task.Assigned", "Task.Started", "Task.Completed"]


def test_a_task_nobody_can_take_is_escalated_with_its_reason(http: TestClient) -> None:
    http.post("/v1/agents", json={"agent_id": "fe-1", "name": "Front", "skills": ["react"], "capacity": 2})
    http.post(
        "/v1/tasks", json={"task_id": "T-9", "description": "Tune Postgres", "required_skills": ["postgres"]}
    )
    escalated = http.post("/v1/tasks/T-9/assign").json()
    assert escalated["status"] == "escalated"
    assert escalated["escalation"]["reason"] == "no_capable_agent"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/agents", {"agent_id": "a", "name": "A", "skills": [], "capacity": 1}, 422),
        ("/v1/agents", {"agent_id": "a", "name": "A", "skills": ["x"], "capacity": 0}, 422),
        ("/v1/tasks", {"task_id": "t", "description": "d", "priority": "urgent"}, 422),
        ("/v1/tasks/nope/assign", None, 404),
    ],
)
def test_bad_task_requests_get_a_4xx_with_a_message(
    http: TestClient, path: str, body: dict[str, Any] | None, status: int
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status
    assert response.json()["error"]


def test_requeuing_a_task_past_its_deadline_asks_for_a_new_one(http: TestClient) -> None:
    # Given a task escalated because its deadline passed
    http.post("/v1/agents", json={"agent_id": "be-1", "name": "Back", "skills": ["golang"], "capacity": 2})
    task = {"task_id": "T-1", "description": "Fix", "required_skills": ["golang"], "deadline": 1_000_000_000}
    assert http.post("/v1/tasks", json=task).status_code == 201
    assert http.post("/v1/tasks/T-1/assign").json()["status"] == "escalated"
    # When it is requeued without deadline_hours
    refused = http.post("/v1/tasks/T-1/requeue", json={"reason": "retry", "requested_by": "lead"})
    # Then that is a 422 asking for one, and nothing is recorded
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith("deadline: "), refused.json()
    assert "deadline_hours" in refused.json()["error"]
    assert [e["event_type"] for e in http.get("/v1/tasks/T-1/history").json()][-1] == "Task.Escalated"
    # And with deadline_hours it is requeued and assigned
    body = {"reason": "retry", "requested_by": "lead", "deadline_hours": 8}
    assert http.post("/v1/tasks/T-1/requeue", json=body).json()["status"] == "pending"
    assert http.post("/v1/tasks/T-1/assign").json()["agent_id"] == "be-1"


def test_the_task_list_is_read_page_by_page_after_the_last_id(http: TestClient) -> None:
    # Given five tasks
    for n in range(5):
        assert http.post("/v1/tasks", json={"task_id": f"T-{n}", "description": "Fix"}).status_code == 201
    ids = lambda response: [t["task_id"] for t in response.json()]  # noqa: E731
    # When the list is read two at a time, each page after the last id of the one before
    first = http.get("/v1/tasks", params={"limit": 2})
    second = http.get("/v1/tasks", params={"limit": 2, "after": ids(first)[-1]})
    third = http.get("/v1/tasks", params={"limit": 2, "after": ids(second)[-1], "status": "PENDING"})
    # Then every task comes once, in order
    assert ids(first) + ids(second) + ids(third) == [f"T-{n}" for n in range(5)]
    # And a cursor that names no task is a 422 that says so
    unknown = http.get("/v1/tasks", params={"after": "T-404"})
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"] == "after: no task 'T-404' in this tenant"


def test_a_requeue_takes_its_new_deadline_as_a_time_as_a_creation_does(http: TestClient) -> None:
    # Given a task escalated because its deadline passed
    http.post("/v1/agents", json={"agent_id": "be-1", "name": "Back", "skills": ["golang"], "capacity": 2})
    task = {"task_id": "T-1", "description": "Fix", "required_skills": ["golang"], "deadline": 1_000_000_000}
    assert http.post("/v1/tasks", json=task).status_code == 201
    assert http.post("/v1/tasks/T-1/assign").json()["status"] == "escalated"
    # When it is requeued with a deadline given as a time
    body = {"reason": "retry", "requested_by": "lead", "deadline": "2030-01-01T00:00:00Z"}
    requeued = http.post("/v1/tasks/T-1/requeue", json=body)
    # Then that is its deadline
    assert requeued.status_code == 200, requeued.text
    assert requeued.json()["deadline"].startswith("2030-01-01T00:00:00")
    # And both forms at once are refused, as for a creation
    both = {**body, "deadline_hours": 2}
    assert http.post("/v1/tasks/T-1/requeue", json=both).status_code == 422


def test_a_released_task_carries_no_assignment_and_its_history_keeps_the_old_one(http: TestClient) -> None:
    # Given a task assigned to the one agent who can take it
    http.post("/v1/agents", json={"agent_id": "be-1", "name": "Backend", "skills": ["golang"], "capacity": 1})
    http.post("/v1/tasks", json={"task_id": "T-9", "description": "Fix it", "required_skills": ["golang"]})
    assert http.post("/v1/tasks/T-9/assign").json()["assignment"]["agent_id"] == "be-1"
    # When it is released
    released = http.post("/v1/tasks/T-9/release").json()
    # Then it waits with no agent and no current assignment, as read back too
    assert (released["status"], released["agent_id"], released["assignment"]) == ("pending", None, None)
    assert http.get("/v1/tasks/T-9").json()["assignment"] is None
    # And its history still says who had it
    events = http.get("/v1/tasks/T-9/history").json()
    assert [e["data"].get("agent_id") for e in events if e["event_type"] == "Task.Assigned"] == ["be-1"]


def test_creating_a_task_or_agent_again_answers_200_as_starting_a_session_again_does(
    http: TestClient,
) -> None:
    # Given a task and an agent just created (201)
    task = {
        "task_id": "t-rep",
        "description": "Fix the worker",
        "required_skills": ["python"],
        "priority": "HIGH",
    }
    agent = {"agent_id": "a-rep", "name": "Backend", "skills": ["python"]}
    first_task = http.post("/v1/tasks", json=task)
    first_agent = http.post("/v1/agents", json=agent)
    assert (first_task.status_code, first_agent.status_code) == (201, 201)
    # When each is sent again with the same fields (a client's retry)
    again_task = http.post("/v1/tasks", json=task)
    again_agent = http.post("/v1/agents", json=agent)
    # Then nothing was created: 200 and the same resource (both answered 201, "created")
    assert (again_task.status_code, again_agent.status_code) == (200, 200)
    assert again_task.json() == first_task.json()
    assert again_agent.json() == first_agent.json()
    assert len(http.get("/v1/tasks/t-rep/history").json()) == 1
    # And other fields are still a conflict
    assert http.post("/v1/tasks", json={**task, "priority": "low"}).status_code == 409
    assert http.post("/v1/agents", json={**agent, "capacity": 3}).status_code == 409


def test_a_skill_spelt_in_full_width_letters_or_decomposed_is_the_same_skill(http: TestClient) -> None:
    wide = "".join(chr(ord(c) + 0xFEE0) for c in "Kubernetes")  # full-width letters
    cafe_nfd, cafe_nfc = "cafe\u0301", "caf\u00e9"
    agent = {"agent_id": "be-u", "name": "Backend", "skills": [wide, cafe_nfd, "stra\u00dfe"], "capacity": 1}
    assert http.post("/v1/agents", json=agent).status_code == 201
    assert http.get("/v1/agents/be-u").json()["skills"] == [cafe_nfc, "kubernetes", "strasse"]
    task = {
        "task_id": "T-u",
        "description": "Scale it",
        "required_skills": ["KUBERNETES", "STRASSE", "CAF\u00c9"],
    }
    created = http.post("/v1/tasks", json=task)
    assert created.status_code == 201
    assert created.json()["required_skills"] == [cafe_nfc, "kubernetes", "strasse"]
    assert http.post("/v1/tasks/T-u/assign").json()["agent_id"] == "be-u"
    # the same agent registered again in another spelling is a repeat, not a conflict
    again = {**agent, "skills": ["kubernetes", cafe_nfc, "STRASSE"]}
    assert http.post("/v1/agents", json=again).status_code == 200


def test_a_skill_drawn_as_nothing_is_refused_and_nothing_recorded(http: TestClient) -> None:
    # An outside probe registered an agent whose only skill was a zero-width space (201)
    for n, invisible in enumerate(["\u200b", "\ufeff", "\u2060\u200d"]):
        agent = {"agent_id": f"inv-{n}", "name": "Invisible", "skills": [invisible]}
        refused = http.post("/v1/agents", json=agent)
        assert refused.status_code == 422, refused.text
        assert "drawn as nothing" in refused.json()["error"]
        assert http.get(f"/v1/agents/inv-{n}").status_code == 404
    task = {"task_id": "T-inv", "description": "d", "required_skills": ["python", "\u200b"]}
    assert http.post("/v1/tasks", json=task).status_code == 422
    assert http.get("/v1/tasks/T-inv").status_code == 404
    # within a name they are dropped: "py" + zero-width space + "thon" is python
    agent = {"agent_id": "zw", "name": "Zero width", "skills": ["py\u200bthon", "\ufeffPython"]}
    assert http.post("/v1/agents", json=agent).json()["skills"] == ["python"]


@pytest.mark.parametrize("model", [" deepseek-v3.2", "deepseek-v3.2 ", "\u2003claude-sonnet-4.5"])
def test_a_model_named_with_spaces_around_it_is_refused_before_anything_is_recorded(
    http: TestClient, simulator: Simulator, model: str
) -> None:
    # An outside probe classified a task with "model": " deepseek-v3.2": the price table read
    # it trimmed, so it passed the unknown-model check, and the provider was asked for the name
    # with its space (a real one has no such model), the call recorded under it. Same for a step.
    http.post("/v1/tasks", json={"task_id": "T-m", "description": "Write docs for the API"})
    calls = len(simulator.exchanges)
    for path in ("/v1/tasks/T-m/classify", "/v1/tasks/T-m/reclassify"):
        refused = http.post(path, json={"model": model})
        assert refused.status_code == 422, refused.text
        assert "model: must have no space around it" in refused.json()["error"]
    assert [e["event_type"] for e in http.get("/v1/tasks/T-m/history").json()] == ["Task.Created"]
    http.post("/v1/sessions", json={"session_id": "s-m", "workflow_name": "wf", "user_id": "u"})
    step = http.post("/v1/sessions/s-m/process", json={"step_name": "a", "input_data": {}, "model": model})
    assert step.status_code == 422, step.text
    assert "model: must have no space around it" in step.json()["error"]
    assert http.get("/v1/sessions/s-m").json()["version"] == 1
    assert len(simulator.exchanges) == calls


TEAMS = (
    ("backend", ["python", "golang", "kubernetes"]),
    ("frontend", ["react", "vue", "css"]),
    ("devops", ["terraform", "aws", "docker"]),
)


def test_assigning_a_task_without_skills_classifies_it_first_as_the_seed_does(
    http: TestClient, simulator: Simulator
) -> None:
    # Given the seed's three teams (DevOps idle, so "least loaded" alone would pick it)
    for agent_id, skills in TEAMS:
        assert http.post(
            "/v1/agents", json={"agent_id": agent_id, "name": agent_id, "skills": skills}
        ).is_success
    # And the task, created without skills and never classified
    assert http.post(
        "/v1/tasks", json={"task_id": "go", "description": "Fix the race in the Go worker"}
    ).is_success
    calls = len(simulator.exchanges)

    # When it is assigned
    assigned = http.post("/v1/tasks/go/assign")

    # Then it was classified on the way (one call, recorded), and its words chose the team
    assert assigned.status_code == 200, assigned.text
    state = assigned.json()
    assert len(simulator.exchanges) == calls + 1
    assert state["classification"]["category"] == "bug_fix"
    assert state["required_skills"] == ["golang"]
    assert state["assignment"]["agent_id"] == "backend"
    events = [e["event_type"] for e in http.get("/v1/tasks/go/history").json()]
    assert events[-2:] == ["Task.Classified", "Task.Assigned"]
    # And a task that names its skills is assigned without a call
    assert http.post(
        "/v1/tasks", json={"task_id": "ui", "description": "x", "required_skills": ["css"]}
    ).is_success
    assert http.post("/v1/tasks/ui/assign").json()["assignment"]["agent_id"] == "frontend"
    assert len(simulator.exchanges) == calls + 1


def test_a_queue_run_classifies_the_tasks_without_skills_first_and_routes_them_by_their_words(
    http: TestClient, simulator: Simulator
) -> None:
    # Given the seed's three teams and tasks created without skills, never classified
    for agent_id, skills in TEAMS:
        agent = {"agent_id": agent_id, "name": agent_id, "skills": skills}
        assert http.post("/v1/agents", json=agent).is_success
    tasks = {
        "go": ("Fix the race in the Go worker", "backend"),
        "ui": ("Add a dark mode toggle to the React settings page", "frontend"),
        "tf": ("Write the Terraform module for the AWS staging VPC", "devops"),
    }
    for task_id, (description, _) in tasks.items():
        assert http.post("/v1/tasks", json={"task_id": task_id, "description": description}).is_success
    calls = len(simulator.exchanges)

    # When the queue runs (a bad limit is refused before any call)
    refused = http.post("/v1/queue/run", json={"limit": 0})
    assert refused.status_code == 422
    assert len(simulator.exchanges) == calls
    offered = http.post("/v1/queue/run")

    # Then each was classified (one call each) and went to the team its words name
    assert offered.status_code == 200, offered.text
    assert len(simulator.exchanges) == calls + 3
    placed = {t["task_id"]: t["assignment"]["agent_id"] for t in offered.json()}
    assert placed == {task_id: team for task_id, (_, team) in tasks.items()}
    assert all(t["classification"] is not None for t in offered.json())


def test_the_seeds_own_agent_and_task_fields_are_taken(http: TestClient) -> None:
    # Given the seed's agent configs ({"id", "name", "skills", "max_capacity"}, 10 by default)
    # and its Task fields ("id", "MEDIUM"), sent as the seed's client would
    backend = {"id": "A1", "name": "Backend Team", "skills": ["python", "golang", "kubernetes"]}
    devops = {"id": "A3", "name": "DevOps", "skills": ["terraform", "aws", "docker"], "max_capacity": 3}
    task = {
        "id": "task_0",
        "description": "Implement REST API feature",
        "required_skills": ["python"],
        "priority": "MEDIUM",
        "deadline_hours": 24,
    }
    # When they are posted
    created = [http.post("/v1/agents", json=backend), http.post("/v1/agents", json=devops)]
    made = http.post("/v1/tasks", json=task)
    # Then they are registered and created under those ids, with the seed's default capacity
    assert [r.status_code for r in created] == [201, 201], [r.text for r in created]
    assert [(r.json()["agent_id"], r.json()["capacity"]) for r in created] == [("A1", 10), ("A3", 3)]
    assert made.status_code == 201, made.text
    assert (made.json()["task_id"], made.json()["priority"]) == ("task_0", "medium")
    # and sent again, they are repeats (200), the capacity changeable under its seed name too
    assert http.post("/v1/agents", json=devops).status_code == 200
    assert http.post("/v1/tasks", json=task).status_code == 200
    paused = http.put("/v1/agents/A3/capacity", json={"max_capacity": 0})
    assert (paused.status_code, paused.json()["capacity"]) == (200, 0)


def test_a_field_given_under_its_name_and_the_seeds_is_refused_with_nothing_recorded(
    http: TestClient,
) -> None:
    both_ids = {"agent_id": "A1", "id": "A2", "name": "Backend Team", "skills": ["python"]}
    both_capacities = {
        "agent_id": "A1",
        "name": "Backend Team",
        "skills": ["python"],
        "capacity": 2,
        "max_capacity": 3,
    }
    both_task_ids = {"task_id": "T-1", "id": "T-2", "description": "Fix it"}
    for path, body in [
        ("/v1/agents", both_ids),
        ("/v1/agents", both_capacities),
        ("/v1/tasks", both_task_ids),
    ]:
        refused = http.post(path, json=body)
        assert refused.status_code == 422, refused.text
        assert "are one field under two names" in refused.json()["error"]
    assert http.get("/v1/agents").json() == []
    assert http.get("/v1/tasks").json() == []


def test_assigning_a_task_no_longer_waiting_answers_its_state_unchanged_and_records_nothing(
    http: TestClient,
) -> None:
    # (Kept, not made a 409: the assign takes no idempotency key, so this answer is what a
    # retry whose first reply was lost reads; docs/tasks.md "Assigning again".)
    engine: Engine = http.app.state.engine  # type: ignore[attr-defined]
    http.post("/v1/agents", json={"agent_id": "a", "name": "A", "skills": ["go"], "capacity": 1})
    for task_id in ("T-1", "T-2"):
        http.post("/v1/tasks", json={"task_id": task_id, "description": "d", "required_skills": ["go"]})
    assigned = http.post("/v1/tasks/T-1/assign").json()
    escalated = http.post("/v1/tasks/T-2/assign").json()  # the only agent is full
    assert (assigned["status"], escalated["status"]) == ("assigned", "escalated")
    head = engine.log.head()
    # When both are assigned again: the same answers, nothing recorded
    again = http.post("/v1/tasks/T-1/assign")
    assert (again.status_code, again.json()) == (200, assigned)
    assert http.post("/v1/tasks/T-2/assign").json() == escalated
    assert engine.log.head() == head
    # And a completed task answers as completed
    http.post("/v1/tasks/T-1/start")
    completed = http.post("/v1/tasks/T-1/complete", json={"resolution": "done"}).json()
    head = engine.log.head()
    after = http.post("/v1/tasks/T-1/assign")
    assert (after.status_code, after.json()) == (200, completed)
    assert engine.log.head() == head
