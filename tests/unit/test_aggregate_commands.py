"""Every aggregate's events carry their command's id and one clock's time, never running backwards."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from eventsourcing.application import project_aggregate

from flowledger.domain.agent import Agent
from flowledger.domain.aggregate import FlowledgerAggregate, command_id_of
from flowledger.domain.assignment import Choice
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.task_views import ReleaseOutcome

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def a_session() -> Session:
    return Session.start(
        session_id="s1",
        tenant="t",
        workflow="cs",
        user_id=None,
        expires_at=T0 + timedelta(days=1),
        metadata={},
    )


def a_task() -> Task:
    return Task.create(
        task_id="t1",
        tenant="t",
        description="fix it",
        required_skills=["python"],
        priority="high",
        deadline=None,
    )


def an_agent() -> Agent:
    return Agent.register(agent_id="a1", tenant="t", name="Ada", skills=["python"], capacity=2)


def session_commands(session: Any) -> None:
    session.record_step(step="greet", input={}, output={"a": 1}, idempotency_key="k1")
    session.update_context({"lang": "en"})


def session_command(session: Any) -> None:
    session.extend(T0 + timedelta(days=2))


def task_commands(task: Any) -> None:
    task.assign(Choice(agent_id="a1", score=1.0, reason="only one"), T0)
    task.start(T0)


def task_command(task: Any) -> None:
    task.complete({"ok": True}, T0)


def agent_commands(agent: Any) -> None:
    agent.accept("t1", T0)
    agent.change_capacity(3)


def agent_command(agent: Any) -> None:
    agent.release("t1", ReleaseOutcome.COMPLETED, T0, 5.0)


Command = Callable[[Any], None]
CASES: list[tuple[Callable[[], FlowledgerAggregate], Command, Command]] = [
    (a_session, session_commands, session_command),
    (a_task, task_commands, task_command),
    (an_agent, agent_commands, agent_command),
]


@pytest.mark.parametrize(("create", "two_events", "one_event"), CASES)
def test_events_of_a_command_carry_its_id_and_never_go_back_in_time(
    create: Callable[[], FlowledgerAggregate], two_events: Command, one_event: Command
) -> None:
    # Given an aggregate created by command c0 at T0
    aggregate = create()
    aggregate.tag_creation("c0", T0)
    # When command c1 runs on a clock five minutes behind the stream
    aggregate.begin("c1", T0 - timedelta(minutes=5))
    two_events(aggregate)
    aggregate.end()
    # and command c2 on a clock ahead of it
    aggregate.begin("c2", T0 + timedelta(seconds=1))
    one_event(aggregate)
    aggregate.end()
    events = aggregate.collect_events()
    # Then every event carries its command's id
    assert [command_id_of(e) for e in events] == ["c0", "c1", "c1", "c2"]
    # and time never runs backwards: c1 is stamped with the stream's last time, c2 with its own
    assert [e.timestamp for e in events] == [T0, T0, T0, T0 + timedelta(seconds=1)]
    assert (aggregate.created_on, aggregate.modified_on) == (T0, T0 + timedelta(seconds=1))
    # and the scope is gone, so a snapshot never carries it
    assert "_command" not in vars(aggregate)


@pytest.mark.parametrize(("create", "two_events", "one_event"), CASES)
def test_events_outside_a_command_carry_no_command_id_and_replay_to_the_same_state(
    create: Callable[[], FlowledgerAggregate], two_events: Command, one_event: Command
) -> None:
    aggregate = create()
    two_events(aggregate)
    one_event(aggregate)
    events = aggregate.collect_events()
    assert [command_id_of(e) for e in events] == [None] * 4
    replayed = project_aggregate(None, events)
    assert replayed is not None
    assert vars(replayed) == vars(aggregate)
