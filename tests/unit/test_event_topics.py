"""Stored topics name each event class by module and qualified name: they must never change."""

from __future__ import annotations

import pytest
from eventsourcing.utils import get_topic, resolve_topic

from flowledger.domain.agent import Agent
from flowledger.domain.session import Session
from flowledger.domain.task import Task

TOPICS = {
    Session: "Started StepStarted StepLeaseRenewed StepProcessed StepFailed ContextUpdated Extended "
    "Completed Expired Abandoned Restarted Reopened",
    Task: "Created Classified Assigned Started Completed Escalated Released ClassificationDiscarded "
    "ClassificationFailed Requeued",
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
