"""Stored topics name each event class by module and qualified name: they must never change."""

from __future__ import annotations

import pytest
from eventsourcing.utils import get_topic, resolve_topic

from flowledger.domain.agent import Agent
from flowledger.domain.session import Session
from flowledger.domain.task import Task

TOPICS = {
    Session: "Started StepStarted StepLeaseRenewed StepProcessed StepFailed ContextUpdated Extended "
    "Completed Expired Abandoned Restarted Reopened Forked DataErased",
    Task: "Created Classified Assigned Started Completed Escalated Released ClassificationDiscarded "
    "ClassificationFailed Requeued RankingDiscarded",
    Agent: "Registered CapacityChanged TaskAccepted TaskReleased",
}
CASES = [(aggregate, name) for aggregate, names in TOPICS.items() for name in names.split()]


@pytest.mark.parametrize(("aggregate", "name"), CASES, ids=[f"{a.__name__}.{n}" for a, n in CASES])
def test_every_event_class_keeps_its_stored_topic(aggregate: type, name: str) -> None:
    topic = f"{aggregate.__module__}:{aggregate.__name__}.{name}"
    assert topic.startswith("flowledger.domain.")
    event_class = getattr(aggregate, name)
    assert get_topic(event_class) == topic
    assert resolve_topic(topic) is event_class


@pytest.mark.parametrize("aggregate", [Session, Task, Agent], ids=["Session", "Task", "Agent"])
def test_every_aggregate_keeps_the_topic_its_snapshots_are_stored_under(aggregate: type) -> None:
    topic = f"flowledger.domain.{aggregate.__name__.lower()}:{aggregate.__name__}"
    assert get_topic(aggregate) == topic
    assert resolve_topic(topic) is aggregate


def test_the_session_events_declared_in_their_own_module_are_stored_as_the_sessions() -> None:
    # (session_events.py declares them; the aggregate's body names them, and the event library
    # redefines each there: what is stored is Session.<Name>, under the topic it always had.)
    from flowledger.domain import session_events

    for name in TOPICS[Session].split():
        declared = getattr(session_events, name)
        stored = getattr(Session, name)
        assert issubclass(stored, declared)
        assert get_topic(stored) == f"flowledger.domain.session:Session.{name}"


def test_the_task_events_declared_in_their_own_module_are_stored_as_the_tasks() -> None:
    from flowledger.domain import task_events

    stored = Task.RankingDiscarded
    assert issubclass(stored, task_events.RankingDiscarded)
    assert get_topic(stored) == "flowledger.domain.task:Task.RankingDiscarded"
