"""An agent's events are read over REST as a task's are.

An outside probe: checking that no agent ever held more tasks than its capacity, over the API
two servers answered, needed each agent's `TaskAccepted` / `TaskReleased` / `CapacityChanged`
events: `GET /v1/agents/backend-0/history` answered 404 "not found: see /openapi.json" (only
the library's `engine.agent_history` had them), while `GET /v1/tasks/{id}/history` answered a
task's. It answers an agent's now, oldest first, 404 for an agent never registered.
"""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_an_agents_history_is_read_over_rest(memory_http: TestClient) -> None:
    http = memory_http
    http.post("/v1/agents", json={"agent_id": "a1", "name": "A1", "skills": ["python"], "capacity": 2})
    http.post("/v1/tasks", json={"task_id": "T1", "description": "Fix it", "required_skills": ["python"]})
    http.post("/v1/tasks/T1/assign")
    http.post("/v1/tasks/T1/release")
    http.put("/v1/agents/a1/capacity", json={"capacity": 0})

    history = http.get("/v1/agents/a1/history")

    assert history.status_code == 200, history.text
    events = [(e["version"], e["event_type"]) for e in history.json()]
    assert events == [
        (1, "Agent.Registered"),
        (2, "Agent.TaskAccepted"),
        (3, "Agent.TaskReleased"),
        (4, "Agent.CapacityChanged"),
    ]
    assert history.json()[1]["data"]["task_id"] == "T1"
    missing = http.get("/v1/agents/nobody/history")
    assert missing.status_code == 404
    assert "nobody" in missing.json()["error"]
