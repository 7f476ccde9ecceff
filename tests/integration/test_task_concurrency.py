"""Capacity under concurrency on real PostgreSQL: 32 threads assign 500 tasks to 5 agents.

Four engines on one schema stand in for four processes (each has its own in-process
locks and connection pool), so the races are settled by the database alone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from flowledger.domain.task_views import EscalationReason, TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

ENGINES = 4
THREADS = 32
TASKS = 500
AGENTS = {  # id: (skills, capacity); every agent knows python
    "be-1": (["python", "golang"], 40),
    "be-2": (["python", "postgres"], 50),
    "fe-1": (["python", "react"], 30),
    "ops-1": (["python", "kubernetes", "terraform"], 60),
    "ops-2": (["python", "kubernetes"], 70),
}
NEEDS = [["python"], ["python", "kubernetes"], ["golang"], ["react"], ["cobol"]]


@pytest.fixture
def engines(database_url: str, pg_schema: str) -> Iterator[list[Engine]]:
    """Four engines on one schema."""
    group = [
        Engine(
            settings=make_settings(database_url=database_url, schema=pg_schema, pool_size=THREADS // ENGINES)
        )
        for _ in range(ENGINES)
    ]
    yield group
    for engine in group:
        engine.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_thirty_two_threads_never_push_an_agent_over_capacity(engines: list[Engine]) -> None:
    # Given five agents and 500 waiting tasks (a fifth of them need a skill nobody has)
    setup = engines[0]
    for agent_id, (skills, capacity) in AGENTS.items():
        setup.register_agent(agent_id, agent_id, skills, capacity)
    rng = random.Random(4)
    task_ids = [f"task-{n:03d}" for n in range(TASKS)]
    for n, task_id in enumerate(task_ids):
        setup.create_task(task_id, f"task {n}", NEEDS[n % len(NEEDS)], rng.choice(["low", "high"]))

    # When 32 threads in four engines assign them (each engine lets one decision at a
    # time through; the four race in the database). Every task is tried by two threads
    # in different engines, so tasks race as well as agents
    def assigner(thread: int) -> list[str]:
        engine = engines[thread // (THREADS // ENGINES)]
        mine = [t for n, t in enumerate(task_ids) if n % (THREADS // 2) == thread % (THREADS // 2)]
        random.Random(thread).shuffle(mine)
        return [engine.assign_task(task_id).status.value for task_id in mine]

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = [status for statuses in pool.map(assigner, range(THREADS)) for status in statuses]

    # Then every task was tried twice, by threads of two engines (a write lost to another writer
    # is possible but not certain: the engines take turns on each agent's lock across processes)
    assert len(outcomes) == 2 * TASKS
    reader = engines[3]

    # And at every version of every agent, load <= capacity
    loads = {}
    for agent_id, (_, capacity) in AGENTS.items():
        final = reader.get_agent(agent_id)
        for version in range(1, final.version + 1):
            at = reader.get_agent(agent_id, version=version)
            assert at.load <= at.capacity == capacity
        loads[agent_id] = final.load
    held = Counter(t for a in AGENTS for t in reader.get_agent(a).active_tasks)
    assert max(held.values()) == 1

    # And every task ended Assigned or Escalated exactly once, agreeing with the agents
    reasons: Counter[str] = Counter()
    for n, task_id in enumerate(task_ids):
        decisions = [
            e for e in reader.task_history(task_id) if e.event_type in ("Task.Assigned", "Task.Escalated")
        ]
        assert len(decisions) == 1, task_id
        task = reader.get_task(task_id)
        if task.status is TaskStatus.ASSIGNED:
            assert task.agent_id is not None
            assert held[task_id] == 1
            assert set(task.required_skills) <= set(AGENTS[task.agent_id][0])
            reasons["assigned"] += 1
        else:
            assert task.status is TaskStatus.ESCALATED
            assert task.escalation is not None
            assert held[task_id] == 0
            reasons[task.escalation.reason] += 1
            if task.escalation.reason == EscalationReason.ALL_AT_CAPACITY:
                # loads only grow here, so every capable agent must have ended full
                capable = [
                    a for a, (skills, _) in AGENTS.items() if set(NEEDS[n % len(NEEDS)]) <= set(skills)
                ]
                assert all(loads[a] == AGENTS[a][1] for a in capable), task_id
    assert reasons["assigned"] == sum(held.values()) == sum(loads.values())
    assert reasons[EscalationReason.NO_CAPABLE_AGENT] == TASKS // len(NEEDS)
    assert reasons["assigned"] + reasons[EscalationReason.ALL_AT_CAPACITY] == TASKS * 4 // 5
