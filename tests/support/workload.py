"""What the load generator does through a ``Balancer``: sessions whose steps go through the
model (every step delivered twice, to two servers, under one idempotency key), and waves
of tasks assigned from two servers at once. What it was told is done is kept in ``Acks``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.load import Balancer, succeeded

STEPS = ("greet", "classify_intent", "resolve")
WORKFLOW = "customer_service"


@dataclass
class Acks:
    """Ids the servers acknowledged: sessions started, steps (by idempotency key), tasks created,
    tasks assigned and completed; ``mismatched`` lists duplicate deliveries that answered
    differently from the first."""

    sessions: set[str] = field(default_factory=set)
    steps: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    assigned: set[str] = field(default_factory=set)
    escalated: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    mismatched: list[str] = field(default_factory=list)
    answered_twice: int = 0
    """Steps whose two deliveries both succeeded."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, value: str) -> None:
        """Note one acknowledged id of ``kind`` (an attribute name)."""
        with self.lock:
            getattr(self, kind).add(value)


def run_session(balancer: Balancer, acks: Acks, session_id: str, *, steps: Sequence[str] = STEPS) -> None:
    """Start a session, then process each step through the model, delivered twice at once to two
    servers with one idempotency key (as a webhook retried by its sender would be)."""
    body = {"session_id": session_id, "workflow": WORKFLOW, "metadata": {"source": "load"}}
    if not succeeded(balancer.deliver("start_session", "POST", "/v1/sessions", body)):
        return
    acks.add("sessions", session_id)
    for number, step in enumerate(steps):
        key = f"{session_id}:{number}"
        request = {
            "step": step,
            "input": {"message": f"step {number} of {session_id}"},
            "idempotency_key": key,
        }
        path = f"/v1/sessions/{session_id}/process"
        first = balancer.next_server()
        answers: list[dict[str, Any]] = []
        duplicate = threading.Thread(
            target=_deliver_step,
            args=(balancer, path, request, (first + 1) % len(balancer.urls), answers),
            daemon=True,
        )
        duplicate.start()
        _deliver_step(balancer, path, request, first, answers)
        duplicate.join(120)
        if answers:
            acks.add("steps", key)
        if len(answers) == 2:
            with acks.lock:
                acks.answered_twice += 1
                if not _same_step(answers[0], answers[1]):
                    acks.mismatched.append(f"{key}: {answers[0]} != {answers[1]}")


def _deliver_step(
    balancer: Balancer, path: str, request: dict[str, Any], server: int, answers: list[dict[str, Any]]
) -> None:
    """One delivery of a step (retried as a balancer would); its answer appended when it succeeded."""
    response = balancer.deliver("process_step", "POST", path, request, server=server)
    if succeeded(response) and response is not None:
        answers.append(response.json())


def _same_step(one: dict[str, Any], other: dict[str, Any]) -> bool:
    return all(one[k] == other[k] for k in ("version", "step", "output", "idempotency_key", "recorded_at"))


def register_agents(balancer: Balancer, agents: int, capacity: int, skill: str = "python") -> None:
    """Register ``agents`` agents of ``capacity`` slots each with one skill (idempotent)."""
    for number in range(agents):
        body = {
            "agent_id": f"agent-{number}",
            "name": f"Agent {number}",
            "skills": [skill],
            "capacity": capacity,
        }
        response = balancer.deliver("register_agent", "POST", "/v1/agents", body)
        if not succeeded(response):
            raise RuntimeError(f"could not register agent-{number}: {response and response.text}")


def task_wave(
    balancer: Balancer, acks: Acks, prefix: str, tasks: int, assigners: tuple[int, int], skill: str = "python"
) -> list[str]:
    """Create ``tasks`` tasks, then assign them all at once from the two ``assigners`` servers
    (each task sent to both); the ids that ended assigned."""
    ids = []
    for number in range(tasks):
        task_id = f"{prefix}-{number}"
        body = {"task_id": task_id, "description": f"fix bug {task_id}", "required_skills": [skill]}
        if succeeded(balancer.deliver("create_task", "POST", "/v1/tasks", body)):
            acks.add("tasks", task_id)
            ids.append(task_id)
    outcome: dict[str, str] = {}

    def assign(task_id: str, server: int) -> None:
        response = balancer.deliver("assign_task", "POST", f"/v1/tasks/{task_id}/assign", server=server)
        if succeeded(response) and response is not None:
            with acks.lock:
                outcome[task_id] = str(response.json()["status"])

    threads = [
        threading.Thread(target=assign, args=(task_id, server), daemon=True)
        for task_id in ids
        for server in assigners
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assigned = [task_id for task_id, state in outcome.items() if state == "assigned"]
    for task_id in assigned:
        acks.add("assigned", task_id)
    for task_id in (t for t, state in outcome.items() if state == "escalated"):
        acks.add("escalated", task_id)
    return assigned


def complete_tasks(balancer: Balancer, acks: Acks, task_ids: Sequence[str]) -> None:
    """Complete each task (its agent is freed)."""
    for task_id in task_ids:
        body = {"resolution": {"fixed": True}}
        if succeeded(balancer.deliver("complete_task", "POST", f"/v1/tasks/{task_id}/complete", body)):
            acks.add("completed", task_id)
