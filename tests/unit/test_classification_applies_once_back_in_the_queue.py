"""A classification recorded while an agent held the task routes it once it waits again.

Classified after it was assigned, a task's classification derives nothing ("not applied, an
agent holds the task"). Released or requeued, it waited with that classification and none of
what it derives: "Fix the race in the Go worker", created without skills, assigned before its
classification, classified bug_fix / critical, then released as "wrong team", went back to
DevOps on the next queue run, "covers no particular skills", still at medium priority, and no
queue run classified it again (it was classified).
"""

from __future__ import annotations

from datetime import timedelta

from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine


def go_bug_held_by_devops(engine: Engine, deadline: timedelta | None = None) -> None:
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"])
    engine.create_task("go-race", "Fix the race in the Go worker", [], "medium", deadline=deadline)
    engine.assign_task("go-race")  # never classified: any agent with room, DevOps
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.record_classification("go-race", "bug_fix", "critical", 3.0)  # not applied: DevOps holds it


def test_a_released_task_is_routed_by_the_classification_made_while_it_was_held(engine: Engine) -> None:
    # Given the Go bug classified while DevOps held it
    go_bug_held_by_devops(engine)
    assert engine.get_task("go-race").required_skills == ()

    # When it is released and the queue runs
    released = engine.release_task("go-race", reason="wrong team")
    placed = {t.task_id: t for t in engine.assign_pending()}

    # Then the classification applies once it waits: golang, critical, a deadline, Backend
    assert released.required_skills == ("golang",)
    assert released.priority.value == "critical"
    assert released.deadline is not None
    assert placed["go-race"].assignment is not None
    assert placed["go-race"].assignment.agent_id == "backend"
    history = engine.task_history("go-race")
    applied = [e.data for e in history if e.event_type == "Task.Classified"][-1]
    assert applied["usage"] is None  # no second model call, nothing to pay
    assert applied["required_skills"] == ["golang"]
    assert "classified while an agent held the task" in applied["derivation"]
    assert "skills golang from the words 'Go'" in applied["derivation"]


def test_a_requeued_task_is_routed_by_the_classification_made_while_it_was_held(engine: Engine) -> None:
    # Given the Go bug classified while DevOps held it, then escalated when its deadline passed
    go_bug_held_by_devops(engine, deadline=timedelta(hours=1))
    escalated = engine.escalate_overdue(engine.clock() + timedelta(hours=2))
    assert [t.task_id for t in escalated] == ["go-race"]

    # When a person requeues it with a new deadline
    requeued = engine.requeue_task("go-race", "ann", "wrong team", deadline=timedelta(hours=8))

    # Then it waits with what its classification derives (the new deadline a person gave stands)
    assert requeued.status is TaskStatus.PENDING
    assert requeued.required_skills == ("golang",)
    assert requeued.priority.value == "critical"
    assert requeued.deadline is not None
    assert requeued.deadline > engine.clock() + timedelta(hours=7)
    placed = {t.task_id: t for t in engine.assign_pending()}
    assert placed["go-race"].assignment is not None
    assert placed["go-race"].assignment.agent_id == "backend"


def test_a_classification_applied_when_made_is_not_applied_again_on_release(engine: Engine) -> None:
    # Given a task classified while it waited, then assigned
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.create_task("go-race", "Fix the race in the Go worker", [], "medium")
    engine.record_classification("go-race", "bug_fix", "critical", 3.0)
    engine.assign_task("go-race")

    # When it is released
    engine.release_task("go-race", reason="busy")

    # Then nothing more is recorded than the release: the classification routed it already
    kinds = [e.event_type for e in engine.task_history("go-race")]
    assert kinds == ["Task.Created", "Task.Classified", "Task.Assigned", "Task.Released"]


def test_a_release_sent_again_is_answered_as_the_first_was(engine: Engine) -> None:
    # Given the Go bug classified while DevOps held it, released once with no key and once
    # (another task) with a key
    go_bug_held_by_devops(engine)
    first = engine.release_task("go-race", reason="wrong team")
    engine.create_task("go-race-2", "Fix the race in the Go worker too", [], "medium")
    engine.assign_task("go-race-2")
    engine.record_classification("go-race-2", "bug_fix", "critical", 3.0)
    keyed = engine.release_task("go-race-2", reason="wrong team", idempotency_key="rel-2")
    versions = (engine.get_task("go-race").version, engine.get_task("go-race-2").version)

    # When each release is sent again, its answer lost
    again = engine.release_task("go-race", reason="wrong team")
    keyed_again = engine.release_task("go-race-2", reason="wrong team", idempotency_key="rel-2")

    # Then each is answered as the first send was (classification applied), nothing recorded
    assert again.required_skills == first.required_skills == ("golang",)
    assert keyed_again.required_skills == keyed.required_skills == ("golang",)
    assert keyed_again.version == keyed.version
    assert (engine.get_task("go-race").version, engine.get_task("go-race-2").version) == versions
