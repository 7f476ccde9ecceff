"""Task and agent commands, run against both the in-memory and the PostgreSQL backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from flowledger.domain.agent import Agent
from flowledger.domain.errors import (
    AgentAtCapacity,
    AgentConflict,
    AgentNotFound,
    TaskConflict,
    TaskNotFound,
    TaskTransitionRejected,
    ValidationError,
)
from flowledger.domain.task_views import EscalationReason, TaskStatus
from flowledger.domain.values import MAX_DEADLINE
from flowledger.infrastructure import Engine


def team(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python", "golang", "kubernetes"], 2)
    engine.register_agent("fe", "Frontend", ["react", "css"], 1)


def test_registering_an_agent_again_with_the_same_fields_returns_it_unchanged(
    engine: Engine,
) -> None:
    first = engine.register_agent("be", "Backend", ["Python", "golang"], 3)
    assert first.skills == ("golang", "python")
    assert engine.register_agent("be", "Backend", ["golang", "python"], 3) == first
    with pytest.raises(AgentConflict) as raised:
        engine.register_agent("be", "Backend", ["golang"], 3)
    assert raised.value.agent_id == "be"
    assert len(engine.agent_history("be")) == 1


def test_creating_a_task_again_is_a_no_op_but_a_different_one_conflicts(engine: Engine) -> None:
    first = engine.create_task("t1", "Fix login", ["python"], "high")
    assert engine.create_task("t1", "Fix login", ["python"], "high") == first
    with pytest.raises(TaskConflict) as raised:
        engine.create_task("t1", "Fix login", ["python"], "low")
    assert raised.value.task_id == "t1"
    with pytest.raises(
        ValidationError,
        match=r"priority: must be one of \['low', 'medium', 'high', 'critical'\] \(any case\), got 'urgent'",
    ):
        engine.create_task("t2", "x", ["python"], "urgent")
    with pytest.raises(
        ValidationError, match=r"required_skills: must be a list of skill names, not a string"
    ):
        engine.create_task("t3", "x", "python")


def test_registering_again_as_first_registered_is_a_repeat_after_a_capacity_change(engine: Engine) -> None:
    # Given an agent registered with capacity 10, then paused by a person
    engine.register_agent("be", "Backend", ["python"], 10)
    engine.set_agent_capacity("be", 0)
    # When its registration is sent again as it was first sent (a setup script run again)
    again = engine.register_agent("be", "Backend", ["python"], 10)
    # Then it is a repeat: the agent as it stands, still paused, nothing appended (it was an
    # AgentConflict, as a task's repeat is compared with what it was created with, not what it is)
    assert (again.capacity, again.version) == (0, 2)
    # And a registration naming the capacity it has now is a repeat too; any other conflicts
    engine.set_agent_capacity("be", 4)
    assert engine.register_agent("be", "Backend", ["python"], 4).capacity == 4
    with pytest.raises(AgentConflict) as raised:
        engine.register_agent("be", "Backend", ["python"], 7)
    assert raised.value.fields == ("capacity",)
    assert str(raised.value).endswith("capacity=4, registered with 10)")
    assert len(engine.agent_history("be")) == 3


def test_a_conflicting_repeat_names_the_fields_it_changed(engine: Engine) -> None:
    # Given a task and an agent
    engine.create_task("t1", "Fix login", ["python"], "high", deadline=timedelta(hours=2))
    engine.register_agent("be", "Backend", ["python"], 3)
    # When they are created again with another description, or other skills and capacity
    with pytest.raises(TaskConflict) as task_raised:
        engine.create_task("t1", "Fix the login", ["python"], "high")
    with pytest.raises(AgentConflict) as agent_raised:
        engine.register_agent("be", "Backend", ["golang"], 4)
    # Then the refusal says what differs (it listed only priority, skills and deadline, so
    # another description read as a conflict over fields that were all the same)
    assert task_raised.value.fields == ("description",)
    assert str(task_raised.value).startswith(
        "task 't1' already exists, and its description differs (it was created with priority='high'"
    )
    assert agent_raised.value.fields == ("skills", "capacity")
    assert str(agent_raised.value) == (
        "agent 'be' already exists, and its skills and capacity differ"
        " (it has name='Backend' skills=['python'] capacity=3)"
    )
    assert len(engine.task_history("t1")) == 1
    assert len(engine.agent_history("be")) == 1


def test_unknown_tasks_and_agents_are_not_found(engine: Engine) -> None:
    with pytest.raises(TaskNotFound) as task_raised:
        engine.assign_task("nope")
    assert task_raised.value.task_id == "nope"
    with pytest.raises(AgentNotFound) as agent_raised:
        engine.get_agent("nobody")
    assert agent_raised.value.agent_id == "nobody"


def test_a_task_goes_to_a_capable_agent_and_both_record_it(engine: Engine) -> None:
    # Given a team and a Go task
    team(engine)
    engine.create_task("t1", "Build the API", ["golang"], "medium")

    # When it is assigned
    task = engine.assign_task("t1")

    # Then the backend agent holds it, and says so in its own history
    assert task.status is TaskStatus.ASSIGNED
    assert task.agent_id == "be"
    assert task.assignment is not None
    assert task.assignment.score == 1.0
    assert engine.get_agent("be").active_tasks == ("t1",)
    assert [e.event_type for e in engine.agent_history("be")] == ["Agent.Registered", "Agent.TaskAccepted"]
    # And assigning it again changes nothing
    assert engine.assign_task("t1") == task


def test_escalation_reasons_distinguish_no_skill_from_no_room(engine: Engine) -> None:
    team(engine)
    engine.create_task("ui-1", "Button", ["react"])
    engine.create_task("ui-2", "Modal", ["react"])
    engine.create_task("mainframe", "Port COBOL", ["cobol"])
    assert engine.assign_task("ui-1").status is TaskStatus.ASSIGNED
    full = engine.assign_task("ui-2")
    nobody = engine.assign_task("mainframe")
    assert full.escalation is not None
    assert full.escalation.reason == EscalationReason.ALL_AT_CAPACITY
    assert nobody.escalation is not None
    assert nobody.escalation.reason == EscalationReason.NO_CAPABLE_AGENT
    assert engine.get_agent("fe").load == 1


def test_a_task_can_wait_for_capacity_instead_of_escalating(engine: Engine) -> None:
    team(engine)
    engine.create_task("ui-1", "Button", ["react"])
    engine.create_task("ui-2", "Modal", ["react"])
    engine.assign_task("ui-1")
    waiting = engine.assign_task("ui-2", escalate_when_full=False)
    assert waiting.status is TaskStatus.PENDING
    engine.complete_task("ui-1", {"pr": 12})
    assert engine.assign_task("ui-2").agent_id == "fe"


def test_the_queue_assigns_a_critical_task_before_an_older_low_one(engine: Engine) -> None:
    # Given one frontend slot and two waiting tasks, the LOW one created first
    team(engine)
    engine.create_task("low", "Polish footer", ["react"], "low")
    engine.create_task("critical", "Checkout broken", ["react"], "critical")

    # When the queue is served
    served = engine.assign_pending()

    # Then the CRITICAL task took the slot and the LOW one waits for the next run
    assert [(t.task_id, t.status) for t in served] == [
        ("critical", TaskStatus.ASSIGNED),
        ("low", TaskStatus.PENDING),
    ]
    assert [(t.task_id, t.status) for t in engine.assign_pending()] == [("low", TaskStatus.PENDING)]


def test_completing_frees_the_agent_and_records_the_completion_time(engine: Engine) -> None:
    team(engine)
    engine.create_task("t1", "API", ["python"])
    engine.assign_task("t1")
    assert engine.start_task("t1").status is TaskStatus.IN_PROGRESS
    done = engine.complete_task("t1", {"merged": True})
    assert done.status is TaskStatus.COMPLETED
    assert done.result == {"merged": True}
    agent = engine.get_agent("be")
    assert agent.load == 0
    assert agent.completed == 1
    assert agent.recent_completion_seconds is not None
    with pytest.raises(TaskTransitionRejected) as raised:
        engine.start_task("t1")
    assert raised.value.status == "completed"


def test_a_released_task_waits_again_and_can_be_reassigned(engine: Engine) -> None:
    team(engine)
    engine.create_task("t1", "API", ["python"])
    engine.assign_task("t1")
    released = engine.release_task("t1", "agent went home")
    assert released.status is TaskStatus.PENDING
    assert engine.get_agent("be").load == 0
    again = engine.assign_task("t1")
    assert again.times_assigned == 2
    kinds = [e.event_type for e in engine.task_history("t1")]
    assert kinds == ["Task.Created", "Task.Assigned", "Task.Released", "Task.Assigned"]


def test_overdue_tasks_are_escalated_once_and_free_their_agent(engine: Engine) -> None:
    # Given an assigned task due in an hour, a waiting one due in a day, and one with no deadline
    team(engine)
    engine.create_task("soon", "Hotfix", ["python"], "high", deadline=timedelta(hours=1))
    engine.create_task("later", "Docs", ["css"], "low", deadline=timedelta(days=1))
    engine.create_task("whenever", "Refactor", ["python"])
    engine.assign_task("soon")
    now = datetime.now(UTC)

    # When the sweep runs two hours on, twice
    first = engine.escalate_overdue(now + timedelta(hours=2))
    second = engine.escalate_overdue(now + timedelta(hours=2))

    # Then only the overdue task was escalated, once, and its agent is free again
    assert [t.task_id for t in first] == ["soon"]
    assert first[0].escalation is not None
    assert first[0].escalation.reason == EscalationReason.DEADLINE_BREACHED
    assert second == []
    assert engine.get_agent("be").load == 0
    assert engine.get_task("later").status is TaskStatus.PENDING
    escalations = [e for e in engine.task_history("soon") if e.event_type == "Task.Escalated"]
    assert len(escalations) == 1
    assert escalations[0].data["agent_id"] == "be"


def test_a_task_already_past_its_deadline_is_escalated_instead_of_assigned(engine: Engine) -> None:
    team(engine)
    engine.create_task("late", "Hotfix", ["python"], deadline=datetime.now(UTC) - timedelta(1))
    task = engine.assign_task("late")
    assert task.escalation is not None
    assert task.escalation.reason == EscalationReason.DEADLINE_BREACHED
    assert engine.get_agent("be").load == 0


def test_capacity_cannot_drop_below_the_current_load(engine: Engine) -> None:
    team(engine)
    engine.create_task("t1", "API", ["python"])
    engine.create_task("t2", "CLI", ["python"])
    engine.assign_pending()
    with pytest.raises(AgentAtCapacity) as raised:
        engine.set_agent_capacity("be", 1)
    assert (raised.value.capacity, raised.value.load) == (1, 2)
    assert str(raised.value) == "agent 'be' holds 2 tasks: its capacity cannot go below that (asked for 1)"
    assert engine.set_agent_capacity("be", 5).capacity == 5


def test_past_versions_of_a_task_can_be_read(engine: Engine) -> None:
    team(engine)
    engine.create_task("t1", "API", ["python"])
    engine.assign_task("t1")
    assert engine.get_task("t1", version=1).status is TaskStatus.PENDING
    assert engine.get_task("t1").version == 2
    with pytest.raises(ValidationError, match=r"version: task has 2 versions, not 3"):
        engine.get_task("t1", version=3)


def test_open_tasks_lists_what_is_neither_completed_nor_escalated(engine: Engine) -> None:
    team(engine)
    for task_id in ("a", "b", "c"):
        engine.create_task(task_id, task_id, ["python"])
    engine.assign_task("a")
    engine.complete_task("a")
    engine.assign_task("b")
    assert [t.task_id for t in engine.open_tasks()] == ["b", "c"]


def test_an_agent_with_many_events_reloads_from_a_snapshot(engine: Engine) -> None:
    # Given more events on one agent than the snapshot interval (50)
    engine.register_agent("busy", "Busy", ["python"], 1)
    for n in range(30):
        engine.create_task(f"t{n}", "work", ["python"])
        engine.assign_task(f"t{n}")
        engine.complete_task(f"t{n}", {"n": n})

    # Then its state reloads intact, recent completions included
    agent = engine.get_agent("busy")
    assert agent.version == 61
    assert agent.completed == 30
    assert agent.load == 0
    assert engine.get_agent("busy", version=50).completed == 24


def test_a_deadline_beyond_ten_years_is_refused_not_an_overflow(engine: Engine) -> None:
    with pytest.raises(ValidationError) as raised:
        engine.create_task("t-far", "someday", deadline=timedelta(days=10**6))
    assert raised.value.field == "deadline"
    with pytest.raises(TaskNotFound, match=r"task 't-far' not found"):
        engine.get_task("t-far")


def test_a_delay_just_past_the_bound_is_refused_saying_how_far_past(engine: Engine) -> None:
    # When a task's deadline is a delay an hour past MAX_DEADLINE
    with pytest.raises(ValidationError) as raised:
        engine.create_task("t-1", "someday", deadline=MAX_DEADLINE + timedelta(hours=1))
    # Then the refusal says the delay given, not the bound twice ("at most 3660 days, got
    # 3660 days": the hour was dropped)
    assert str(raised.value) == "deadline: must be at most 3660 days, got 3660 days, 1:00:00"
    with pytest.raises(TaskNotFound):
        engine.get_task("t-1")


def test_a_deadline_given_as_a_moment_has_the_same_bound_as_one_given_as_a_delay(engine: Engine) -> None:
    # Given the bound a delay has (MAX_DEADLINE, about ten years from now)
    now = datetime.now(UTC)
    beyond = [
        now + MAX_DEADLINE + timedelta(hours=1),
        datetime(2200, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-5))),  # year 10000 in UTC
    ]
    # When tasks are created with deadlines as moments beyond it
    for n, deadline in enumerate(beyond):
        with pytest.raises(ValidationError, match="at most 3660 days after now") as raised:
            engine.create_task(f"t-{n}", "someday", deadline=deadline)
        # Then each is refused, naming the field, and no task exists
        assert raised.value.field == "deadline"
        with pytest.raises(TaskNotFound):
            engine.get_task(f"t-{n}")
    # And a moment within it is taken, a past one too (the task is escalated when offered)
    within = now + MAX_DEADLINE - timedelta(hours=1)
    assert engine.create_task("t-far", "someday", deadline=within).deadline == within
    late = engine.create_task("t-late", "hotfix", deadline=now - timedelta(days=1))
    assert late.status is TaskStatus.PENDING
    # And a requeue's new deadline has the same bound, in both forms
    engine.create_task("t-esc", "nobody can", ["cobol"])
    assert engine.assign_task("t-esc").status is TaskStatus.ESCALATED
    for deadline in (beyond[1], timedelta(days=10**4)):
        with pytest.raises(ValidationError) as requeue_raised:
            engine.requeue_task("t-esc", "alice", "again", deadline)
        assert requeue_raised.value.field == "deadline"
    assert engine.get_task("t-esc").status is TaskStatus.ESCALATED


def test_the_log_index_knows_a_tasks_required_skills_as_created(engine: Engine) -> None:
    # Given a task created with skills
    engine.create_task("t", "Fix the API", ["Python", "sql"])
    # When the index reads the log
    index = engine.task_reads.index
    index.refresh()
    entry = index.task_entry(engine.task_reads.task_uuid("t"))
    # Then it knows them, normalised, without loading the task
    assert entry is not None
    assert entry.required_skills == ("python", "sql")
    assert index.task_entry(engine.task_reads.task_uuid("unknown")) is None


def test_an_agent_copy_shares_no_container_with_the_original() -> None:
    # Given an agent holding a task
    agent = Agent.register(agent_id="be", tenant="t", name="Backend", skills=["python"], capacity=3)
    agent.accept("t1", datetime(2026, 1, 1, tzinfo=UTC))
    # When a copy takes another task
    clone = agent.copy()
    clone.accept("t2", datetime(2026, 1, 1, tzinfo=UTC))
    # Then the original is unchanged, and the copy has both
    assert agent.load == 1
    assert clone.active.keys() == {"t1", "t2"}
    assert len(agent.collect_events()) == 2
    assert len(clone.collect_events()) == 3


def test_the_log_index_decodes_no_agent_change_it_already_follows(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent the index follows, and tasks this engine assigned to it (its own saves
    # are followed as they are made)
    engine.register_agent("be", "Backend", ["python"], 10)
    index = engine.task_reads.index
    index.refresh()
    for n in range(3):
        engine.create_task(f"t{n}", "Fix the API", ["python"])
        assert engine.assign_task(f"t{n}").status is TaskStatus.ASSIGNED
    # When the index catches up with the log, decodes counted by topic
    mapper = index._app.mapper
    decode = mapper.to_domain_event
    decoded: list[str] = []

    def counting(stored: object) -> object:
        decoded.append(str(getattr(stored, "topic", "")))
        return decode(stored)

    monkeypatch.setattr(mapper, "to_domain_event", counting)
    index.refresh()
    # Then no agent change was decoded (each would have changed nothing), and the roster is right
    assert not [topic for topic in decoded if "Agent" in topic]
    assert [p.load for p in index.agent_profiles()] == [3]


def test_a_released_or_requeued_task_has_no_current_assignment(engine: Engine) -> None:
    # Given two assigned tasks
    team(engine)
    engine.create_task("t1", "API", ["python"])
    engine.create_task("t2", "Hotfix", ["python"], deadline=timedelta(hours=1))
    engine.assign_task("t1")
    engine.assign_task("t2")
    # When one is released, and the other escalated from its agent and requeued
    released = engine.release_task("t1", "agent went home")
    [escalated] = engine.escalate_overdue(datetime.now(UTC) + timedelta(hours=2))
    requeued = engine.requeue_task("t2", "alice", "back", deadline=datetime.now(UTC) + timedelta(days=1))
    # Then neither carries the agent it had as its assignment (the history does)
    assert escalated.assignment is not None
    assert (released.assignment, released.agent_id) == (None, None)
    assert (requeued.assignment, requeued.agent_id) == (None, None)
    assert engine.get_task("t1").assignment is None
    assert engine.get_task("t2").assignment is None
    assert [e.data["agent_id"] for e in engine.task_history("t1") if e.event_type == "Task.Assigned"] == [
        "be"
    ]
    # And assigned again, the new assignment is current
    again = engine.assign_task("t1")
    assert again.assignment is not None
    assert again.agent_id == "be"
