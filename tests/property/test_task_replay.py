"""Property: tasks and agents, driven through the engine, agree with a reference model, and
their state at every version is a pure fold of their events, snapshots or not.

The reference model is written here from the rules as the README states them (a task
goes to an agent that has every required skill and room, the least loaded relative to its
capacity; with none it escalates, ``no_capable_agent`` or ``all_at_capacity``; load is the
set of tasks held): plain dicts and sets, nothing taken from the code under test.
Commands are drawn from what the model says is possible, so nearly all are accepted, and
snapshots are taken every 5 events so agents' histories pass several of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.application import project_aggregate
from hypothesis import event, given, target
from hypothesis import strategies as st

from flowledger.domain.agent import agent_uuid
from flowledger.domain.errors import AgentAtCapacity
from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine, Settings

SNAPSHOT_INTERVAL = 5
SKILLS = ("python", "go", "sql", "react")
AGENTS = {  # a hand-written pool: who knows what, and how much each can hold
    "ana": ({"python", "sql"}, 2),
    "bo": ({"go"}, 1),
    "cy": ({"python", "go", "react"}, 3),
}


@dataclass
class ModelTask:
    skills: frozenset[str]
    status: str = "pending"
    agent: str | None = None
    times_assigned: int = 0
    escalation: str | None = None


@dataclass
class ModelAgent:
    skills: set[str]
    capacity: int
    active: set[str] = field(default_factory=set)
    completed: int = 0


@dataclass
class Model:
    agents: dict[str, ModelAgent]
    tasks: dict[str, ModelTask] = field(default_factory=dict)

    def with_status(self, *statuses: str) -> list[str]:
        return sorted(t for t, task in self.tasks.items() if task.status in statuses)

    def eligible(self, skills: frozenset[str]) -> list[str]:
        agents = self.agents.items()
        return [a for a, agent in agents if skills <= agent.skills and len(agent.active) < agent.capacity]


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(database_url="memory:", home=Path("/nonexistent"), snapshot_interval=SNAPSHOT_INTERVAL)


def new_engine(settings: Settings) -> tuple[Engine, Model]:
    # A clock that ticks a second per reading: the engine ranks agents by their recent
    # completion times, so with the wall clock a tie could break differently when Hypothesis
    # replays an example, and the commands drawn after it would differ (a flaky strategy).
    ticks = itertools.count()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    engine = Engine(settings=settings, clock=lambda: start + timedelta(seconds=next(ticks)))
    for agent_id, (skills, capacity) in AGENTS.items():
        engine.register_agent(agent_id, agent_id.title(), sorted(skills), capacity)
    return engine, Model({a: ModelAgent(set(s), c) for a, (s, c) in AGENTS.items()})


def run_one(engine: Engine, model: Model, data: st.DataObject) -> str:
    """Draw one command the model allows, run it on the engine and on the model; its name."""
    choices = ["create"] * 2 + ["capacity"]
    if model.with_status("pending"):
        choices += ["assign"] * 3
    if model.with_status("assigned"):
        choices += ["start"]
    if model.with_status("assigned", "in_progress"):
        choices += ["complete", "complete", "release"]
    command = data.draw(st.sampled_from(choices), label="command")
    if command == "create":
        task_id = f"t{len(model.tasks)}"
        skills = data.draw(st.frozensets(st.sampled_from(SKILLS), max_size=2), label="skills")
        engine.create_task(task_id, f"task {task_id}", sorted(skills))
        model.tasks[task_id] = ModelTask(skills)
    elif command == "assign":
        task_id = data.draw(st.sampled_from(model.with_status("pending")), label="task")
        task = model.tasks[task_id]
        eligible = model.eligible(task.skills)
        state = engine.assign_task(task_id)
        if eligible:
            # The chosen agent is eligible and none eligible is less loaded relative to capacity.
            chosen = state.agent_id
            assert chosen in eligible, (chosen, eligible)
            ratio = {a: len(model.agents[a].active) / model.agents[a].capacity for a in eligible}
            assert ratio[chosen] == min(ratio.values())
            task.status, task.agent = "assigned", chosen
            task.times_assigned += 1
            model.agents[chosen].active.add(task_id)
        else:
            capable = [a for a, agent in model.agents.items() if task.skills <= agent.skills]
            task.status = "escalated"
            task.escalation = "all_at_capacity" if capable else "no_capable_agent"
    elif command == "start":
        task_id = data.draw(st.sampled_from(model.with_status("assigned")), label="task")
        engine.start_task(task_id)
        model.tasks[task_id].status = "in_progress"
    elif command in ("complete", "release"):
        task_id = data.draw(st.sampled_from(model.with_status("assigned", "in_progress")), label="task")
        task = model.tasks[task_id]
        assert task.agent is not None
        holder = model.agents[task.agent]
        holder.active.discard(task_id)
        if command == "complete":
            engine.complete_task(task_id, {"ok": True})
            task.status = "completed"  # no holder, but agent_id names the agent that completed it
            holder.completed += 1
        else:
            engine.release_task(task_id, "handed back")
            task.status, task.agent = "pending", None
    else:
        agent_id = data.draw(st.sampled_from(sorted(model.agents)), label="agent")
        agent = model.agents[agent_id]
        capacity = data.draw(st.integers(0, 4), label="capacity")
        if capacity < len(agent.active):
            before = engine.get_agent(agent_id).version
            held = f"{len(agent.active)} task{'' if len(agent.active) == 1 else 's'}"
            with pytest.raises(
                AgentAtCapacity, match=f"holds {held}: its capacity cannot go below"
            ) as raised:
                engine.set_agent_capacity(agent_id, capacity)
            assert (raised.value.capacity, raised.value.load) == (capacity, len(agent.active))
            assert engine.get_agent(agent_id).version == before, "a refused command appends nothing"
            return "refused"
        engine.set_agent_capacity(agent_id, capacity)
        agent.capacity = capacity
    return command


def check_against_model(engine: Engine, model: Model) -> None:
    for task_id, task in model.tasks.items():
        state = engine.get_task(task_id)
        assert (state.status.value, state.agent_id, state.times_assigned) == (
            task.status,
            task.agent,
            task.times_assigned,
        ), task_id
        if task.escalation is not None:
            assert state.escalation is not None
            assert state.escalation.reason == task.escalation
    for agent_id, agent in model.agents.items():
        got = engine.get_agent(agent_id)
        assert set(got.active_tasks) == agent.active, agent_id
        assert (got.completed, got.capacity) == (agent.completed, agent.capacity), agent_id


@given(data=st.data())
def test_tasks_and_agents_follow_the_reference_model_and_replay_to_every_version(
    settings: Settings, data: st.DataObject
) -> None:
    engine, model = new_engine(settings)
    try:
        # Given a program of commands, each run on the engine and on the reference model
        live: dict[tuple[str, str, int], Any] = {}
        length = data.draw(st.integers(10, 60), label="length")
        commands = [run_one(engine, model, data) for _ in range(length)]
        for task_id in model.tasks:
            state = engine.get_task(task_id)
            live[("task", task_id, state.version)] = state
        event(f"refused commands: {commands.count('refused')}")

        # Then the engine agrees with the model
        check_against_model(engine, model)

        # And every version of every task and agent is the fold of its events
        versions = 0
        for agent_id in AGENTS:
            final = engine.get_agent(agent_id)
            stream = engine.log.stream(agent_uuid(engine.tenant, agent_id))
            assert len(stream) == final.version
            for version in range(1, final.version + 1):
                folded = project_aggregate(None, stream[:version])
                assert folded is not None
                assert engine.get_agent(agent_id, version=version) == folded.state()
            versions = max(versions, final.version)
            snapshots = engine.log.snapshots(agent_uuid(engine.tenant, agent_id))
            assert len(snapshots) == final.version // SNAPSHOT_INTERVAL
        for task_id in model.tasks:
            stream = engine.log.stream(task_uuid(engine.tenant, task_id))
            for version in range(1, len(stream) + 1):
                folded = project_aggregate(None, stream[:version])
                assert folded is not None
                assert engine.get_task(task_id, version=version) == folded.state()
            assert folded.state() == live[("task", task_id, len(stream))]
        target(float(versions), label="longest agent history")
        event(f"longest agent history past {versions // SNAPSHOT_INTERVAL} snapshots")
    finally:
        engine.close()
