"""Hypothesis: the policy over random agents and tasks, and the Agent's load fold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowledger.domain.agent import Agent
from flowledger.domain.assignment import (
    AgentProfile,
    Choice,
    Needs,
    NoChoice,
    QueuedTask,
    choose_agent,
    in_queue_order,
)
from flowledger.domain.errors import AgentAtCapacity, TaskNotHeld
from flowledger.domain.task_views import EscalationReason, ReleaseOutcome, TaskPriority

SKILLS = ["python", "go", "react", "sql", "k8s", "aws"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@st.composite
def profiles(draw: st.DrawFn) -> list[AgentProfile]:
    count = draw(st.integers(min_value=0, max_value=8))
    agents = []
    for n in range(count):
        capacity = draw(st.integers(min_value=0, max_value=5))
        agents.append(
            AgentProfile(
                agent_id=f"agent-{n}",
                skills=frozenset(draw(st.sets(st.sampled_from(SKILLS), max_size=4))),
                capacity=capacity,
                load=draw(st.integers(min_value=0, max_value=capacity)),
                recent_completion_seconds=draw(st.none() | st.floats(min_value=0, max_value=1e5)),
            )
        )
    return agents


required_skills = st.sets(st.sampled_from(SKILLS), max_size=3)


def relative(agent: AgentProfile) -> float:
    """Load over capacity, worked out here (a full agent of capacity 0 counts as 1)."""
    return agent.load / agent.capacity if agent.capacity else 1.0


@given(profiles(), required_skills, st.text(min_size=1, max_size=8))
def test_the_chosen_agent_covers_the_skills_has_room_and_is_least_loaded(
    agents: list[AgentProfile], required: set[str], task_id: str
) -> None:
    decision = choose_agent(task_id, required, agents)
    # The oracle: set inclusion and arithmetic on the generated profiles, not the policy's helpers.
    eligible = [a for a in agents if required <= set(a.skills) and a.load < a.capacity]
    if isinstance(decision, Choice):
        chosen = next(a for a in agents if a.agent_id == decision.agent_id)
        assert chosen in eligible
        assert relative(chosen) == min(relative(a) for a in eligible)
        assert 0.0 <= decision.score <= 1.0
        assert f"least loaded of {len(eligible)} eligible (" in decision.reason
    else:
        assert eligible == []


@given(profiles(), required_skills, st.data())
def test_a_choice_among_some_agents_counts_every_eligible_one_and_chooses_the_same(
    agents: list[AgentProfile], required: set[str], data: st.DataObject
) -> None:
    # Given the agents an engine considers first (those whose locks its batch holds)
    considered = agents[: data.draw(st.integers(min_value=0, max_value=len(agents)))]
    in_all = len([a for a in agents if required <= set(a.skills) and a.load < a.capacity])
    among = len([a for a in considered if required <= set(a.skills) and a.load < a.capacity])
    # When it chooses among them, telling the policy how many are eligible in all
    decision = choose_agent("t", required, considered, eligible_in_all=in_all)
    # Then the agent is the one it would choose among them anyway, and the reason's counts are true
    plain = choose_agent("t", required, considered)
    assert type(decision) is type(plain)
    if isinstance(decision, Choice) and isinstance(plain, Choice):
        assert decision.agent_id == plain.agent_id
        assert decision.score == plain.score
        if among < in_all:
            said = f"least loaded of the {among} considered first, {in_all} eligible in all ("
            assert said in decision.reason
        else:
            assert decision.reason == plain.reason


@given(profiles(), required_skills)
def test_escalation_reason_says_whether_anyone_capable_exists(
    agents: list[AgentProfile], required: set[str]
) -> None:
    decision = choose_agent("t", required, agents)
    if isinstance(decision, NoChoice):
        capable = [a for a in agents if required <= set(a.skills)]
        expected = EscalationReason.ALL_AT_CAPACITY if capable else EscalationReason.NO_CAPABLE_AGENT
        assert decision.reason is expected


SKILL_TABLE = [  # agent's skills, required skills, covered? (written by hand)
    ({"python", "sql"}, set(), True),
    ({"python", "sql"}, {"python"}, True),
    ({"python", "sql"}, {"sql", "python"}, True),
    ({"python", "sql"}, {"python", "go"}, False),
    (set(), {"python"}, False),
    (set(), set(), True),
    ({"react"}, {"React"}, False),
]


@pytest.mark.parametrize(("skills", "required", "covered"), SKILL_TABLE)
def test_an_agent_is_offered_a_task_only_with_every_required_skill(
    skills: set[str], required: set[str], covered: bool
) -> None:
    agent = AgentProfile(
        agent_id="a", skills=frozenset(skills), capacity=1, load=0, recent_completion_seconds=None
    )
    decision = choose_agent("t", required, [agent])
    assert isinstance(decision, Choice) is covered
    if not covered:
        assert isinstance(decision, NoChoice)
        assert decision.reason is EscalationReason.NO_CAPABLE_AGENT


queued_tasks = st.lists(
    st.builds(
        QueuedTask,
        task_id=st.uuids().map(str),
        priority=st.sampled_from(TaskPriority),
        deadline=st.none() | st.integers(0, 1000).map(lambda m: T0 + timedelta(minutes=m)),
        created_at=st.integers(0, 1000).map(lambda m: T0 + timedelta(minutes=m)),
    ),
    max_size=30,
)


@given(queued_tasks)
def test_the_queue_never_serves_a_lower_priority_before_a_higher_one(tasks: list[QueuedTask]) -> None:
    ranks = [t.priority.rank for t in in_queue_order(tasks)]
    assert ranks == sorted(ranks, reverse=True)
    assert sorted(map(id, in_queue_order(tasks))) == sorted(map(id, tasks))


commands = st.lists(
    st.tuples(st.sampled_from(["accept", "accept", "release", "capacity"]), st.integers(0, 6)),
    min_size=5,
    max_size=60,
)


@given(st.integers(0, 4), commands)
def test_agent_load_is_accepted_minus_released_and_never_exceeds_capacity(
    capacity: int, script: list[tuple[str, int]]
) -> None:
    # Given an agent, a model of what it holds, and a random script of accepts, releases and capacity changes
    agent = Agent.register(agent_id="a", tenant="t", name="A", skills=["go"], capacity=max(capacity, 1))
    agent.change_capacity(capacity)  # 0 pauses it: an agent is registered with room for a task
    held: set[str] = set()
    limit = capacity
    for command, n in script:
        task_id = f"task-{n}"
        if command == "accept":
            if task_id in held or len(held) < limit:
                agent.accept(task_id, T0)
                held.add(task_id)
            else:
                held_text = f"{len(held)} task{'' if len(held) == 1 else 's'}"
                with pytest.raises(
                    AgentAtCapacity, match=f"is full: it holds {held_text} of a capacity of {limit}"
                ):
                    agent.accept(task_id, T0)
        elif command == "release":
            if task_id in held:
                agent.release(task_id, ReleaseOutcome.COMPLETED, T0, float(n))
                held.discard(task_id)
            else:
                with pytest.raises(TaskNotHeld) as raised:
                    agent.release(task_id, ReleaseOutcome.COMPLETED, T0, float(n))
                assert raised.value.task_id == task_id
        elif n < len(held):
            with pytest.raises(AgentAtCapacity) as refused:
                agent.change_capacity(n)
            assert (refused.value.capacity, refused.value.load) == (n, len(held))
        else:
            agent.change_capacity(n)
            limit = n
        # Then at every version the agent holds exactly what the model says
        assert agent.load == len(held) <= limit
        assert set(agent.state().active_tasks) == held
        assert agent.state().capacity == limit

    # And replaying the events gives the same agent
    events = agent.collect_events()
    replayed = None
    for event in events:
        replayed = event.mutate(replayed)
    assert isinstance(replayed, Agent)
    assert replayed.state() == agent.state()


def best_cover(required: set[str], agents: list[AgentProfile]) -> int:
    """The most of ``required`` any agent not paused covers, worked out here (at least one)."""
    return max([len(required & set(a.skills)) for a in agents if a.capacity > 0] + [1])


@given(profiles(), required_skills, st.text(min_size=1, max_size=8))
def test_derived_skills_go_to_an_agent_covering_the_most_of_them_with_room(
    agents: list[AgentProfile], required: set[str], task_id: str
) -> None:
    # Given skills the catalogue derived (a preference, not a requirement)
    decision = choose_agent(task_id, Needs.of(required, derived=True), agents)
    # The oracle: the most any agent of the roster covers, room or not, paused aside (at least one)
    most = best_cover(required, agents) if required else 0
    capable = [a for a in agents if len(required & set(a.skills)) >= most]
    eligible = [a for a in capable if a.load < a.capacity]
    if isinstance(decision, Choice):
        chosen = next(a for a in agents if a.agent_id == decision.agent_id)
        assert chosen in eligible
        assert relative(chosen) == min(relative(a) for a in eligible)
        assert 0.0 <= decision.score <= 1.0
        if most < len(required):
            covered = ", ".join(sorted(required & set(chosen.skills)))
            assert f"covers {most} of {len(required)} derived skills: {covered};" in decision.reason
        # And when some agent covers them all, the choice is the one named skills get
        if most == len(required):
            assert decision == choose_agent(task_id, required, agents)
    else:
        assert eligible == []
        expected = EscalationReason.ALL_AT_CAPACITY if capable else EscalationReason.NO_CAPABLE_AGENT
        assert decision.reason is expected


@given(profiles(), required_skills, st.data())
def test_derived_skills_among_some_agents_are_weighed_against_the_whole_roster(
    agents: list[AgentProfile], required: set[str], data: st.DataObject
) -> None:
    # Given derived skills weighed against the roster, and the agents an engine considers first
    needs = Needs.of(required, derived=True).against(agents)
    considered = agents[: data.draw(st.integers(min_value=0, max_value=len(agents)))]
    # When it chooses among them
    decision = choose_agent("t", needs, considered)
    # Then an agent covering fewer than the best of the roster is never chosen
    if isinstance(decision, Choice):
        chosen = next(a for a in considered if a.agent_id == decision.agent_id)
        assert len(required & set(chosen.skills)) >= (best_cover(required, agents) if required else 0)


@given(profiles(), required_skills)
def test_named_skills_stay_a_requirement(agents: list[AgentProfile], required: set[str]) -> None:
    assert choose_agent("t", Needs.of(required), agents) == choose_agent("t", required, agents)
