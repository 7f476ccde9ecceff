"""Arguments of the wrong type are ValidationErrors naming the field, never a raw TypeError or
AttributeError from deep inside: versions, skills, the engine's clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings

NOT_VERSIONS: list[Any] = ["3", 1.5, 2.0, True, False, [1], 0, -1]


@pytest.mark.parametrize("version", NOT_VERSIONS, ids=repr)
def test_a_session_version_that_is_not_a_whole_number_from_one_is_refused(
    engine: Engine, version: Any
) -> None:
    # Given a session of four versions
    engine.start_session("s", "wf")
    for step in ("a", "b", "c"):
        engine.record_step("s", step)
    # When it is read at a version that is no version
    with pytest.raises(ValidationError) as raised:
        engine.get_session("s", version=version)
    # Then the version is refused as such (not "session has 1 version, not 1.5")
    assert raised.value.field == "version"
    assert "version, not" not in raised.value.message
    assert "versions, not" not in raised.value.message


@pytest.mark.parametrize("version", NOT_VERSIONS, ids=repr)
def test_a_task_or_agent_version_that_is_not_a_whole_number_from_one_is_refused(
    engine: Engine, version: Any
) -> None:
    engine.create_task("t", "something")
    engine.register_agent("a", "A", ["x"])
    with pytest.raises(ValidationError) as task_refused:
        engine.get_task("t", version=version)
    with pytest.raises(ValidationError) as agent_refused:
        engine.get_agent("a", version=version)
    assert task_refused.value.field == agent_refused.value.field == "version"


def test_an_agent_read_past_its_last_version_is_refused_as_a_task_read_is(engine: Engine) -> None:
    engine.register_agent("a", "A", ["x"])
    with pytest.raises(ValidationError, match="agent has 1 version, not 5"):
        engine.get_agent("a", version=5)


# (A dict was taken for its keys: {"python": 1} registered an agent with skill "python".)
@pytest.mark.parametrize(
    "skills", [None, 5, object(), {"python": 1}], ids=["None", "5", "an-object", "a-dict"]
)
def test_skills_that_are_not_a_list_of_names_are_refused(engine: Engine, skills: Any) -> None:
    with pytest.raises(ValidationError) as agent_refused:
        engine.register_agent("a", "A", skills)
    with pytest.raises(ValidationError) as task_refused:
        engine.create_task("t", "something", required_skills=skills)
    assert agent_refused.value.field == "skills"
    assert task_refused.value.field == "required_skills"
    assert engine.list_agents() == []
    assert engine.list_tasks() == []


@pytest.mark.parametrize("reading", ["now", None, 1_767_225_600, "2026-01-01T00:00:00Z"], ids=repr)
def test_an_engine_refuses_a_clock_that_does_not_return_a_datetime(reading: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")), clock=lambda: reading)
    assert raised.value.field == "clock"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda e: e.assign_pending(escalate_when_full="no"), "escalate_when_full"),
        (lambda e: e.assign_task("t", escalate_when_full="no"), "escalate_when_full"),
        (lambda e: e.assign_pending(limit="3"), "limit"),
        (lambda e: e.assign_pending(limit=0), "limit"),
        (lambda e: e.assign_pending(limit=True), "limit"),
        (lambda e: e.assign_pending(limit=1001), "limit"),
        (lambda e: e.list_tasks(agent_id=5), "agent_id"),
    ],
    ids=[
        "pending-escalate-no",
        "assign-escalate-no",
        "limit-string",
        "limit-zero",
        "limit-bool",
        "limit-over-rests-1000",
        "agent-int",
    ],
)
def test_the_queues_arguments_are_checked_as_the_http_api_checks_them(
    engine: Engine, call: Any, field: str
) -> None:
    # (A string "no" was taken as true and escalated tasks; limit "3" raised TypeError; limit 0
    # and an agent id 5 answered [] where REST says 422.)
    engine.register_agent("a", "A", ["x"], capacity=1)
    engine.set_agent_capacity("a", 0)  # paused: registering takes a capacity of at least 1
    engine.create_task("t", "something", ["x"])
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        call(engine)
    assert raised.value.field == field
    assert engine.log.head() == before


SESSION_COMMANDS: list[Any] = [
    lambda e, sid: e.start_session(sid, "wf"),
    lambda e, sid: e.restart_session(sid, "wf"),
    lambda e, sid: e.record_step(sid, "step"),
    lambda e, sid: e.update_context(sid, {"k": 1}),
    lambda e, sid: e.extend_session(sid, timedelta(hours=1)),
    lambda e, sid: e.set_expiry(sid, datetime.now(UTC) + timedelta(hours=1)),
    lambda e, sid: e.change_expiry(sid, by=timedelta(hours=1)),
    lambda e, sid: e.complete_session(sid, "done"),
    lambda e, sid: e.abandon_session(sid, "gone"),
]
SESSION_COMMAND_IDS = [
    "start",
    "restart",
    "record_step",
    "update_context",
    "extend",
    "set_expiry",
    "change_expiry",
    "complete",
    "abandon",
]


@pytest.mark.parametrize("session_id", [["s"], {"s": 1}, {"s"}], ids=["list", "dict", "set"])
@pytest.mark.parametrize("command", SESSION_COMMANDS, ids=SESSION_COMMAND_IDS)
def test_a_session_id_that_is_no_string_is_refused_by_every_session_command(
    engine: Engine, command: Any, session_id: Any
) -> None:
    # (A list or dict raised TypeError "unhashable type": the session's write lock was taken
    # on the id before the id was checked.)
    engine.start_session("s", "wf")
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        command(engine, session_id)
    assert raised.value.field == "session_id"
    assert engine.log.head() == before


TASK_COMMANDS: list[Any] = [
    lambda e, t: e.assign_task(t),
    lambda e, t: asyncio.run(e.assign_task_ranked(t)),
    lambda e, t: e.start_task(t),
    lambda e, t: e.complete_task(t),
    lambda e, t: e.release_task(t),
    lambda e, t: e.requeue_task(t, "alice", "why"),
    lambda e, t: e.get_task(t),
    lambda e, t: e.task_history(t),
]
TASK_COMMAND_IDS = ["assign", "assign_ranked", "start", "complete", "release", "requeue", "get", "history"]


@pytest.mark.parametrize("task_id", [["t"], {"t": 1}, {"t"}], ids=["list", "dict", "set"])
@pytest.mark.parametrize("command", TASK_COMMANDS, ids=TASK_COMMAND_IDS)
def test_a_task_id_that_is_no_string_is_refused_by_every_task_command(
    engine: Engine, command: Any, task_id: Any
) -> None:
    # (On PostgreSQL assign_task(["t"]) raised TypeError "unhashable type": the agents' locks
    # were planned on the batch's ids before the id was checked, failing the whole batch.)
    engine.register_agent("a", "A", ["python"])
    engine.create_task("t", "something", required_skills=["python"])
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        command(engine, task_id)
    assert raised.value.field == "task_id"
    assert engine.log.head() == before


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e.extend_session("s", timedelta(hours=1), reopen_expired="no"),
        lambda e: e.set_expiry("s", datetime.now(UTC) + timedelta(hours=1), reopen_expired=1),
        lambda e: e.change_expiry("s", by=timedelta(hours=1), reopen_expired=None),
    ],
    ids=["extend-string", "set_expiry-int", "change_expiry-None"],
)
def test_reopen_expired_that_is_not_true_or_false_is_refused(engine: Engine, call: Any) -> None:
    # (Any value was taken for its truth: "no" reopened an expired session.)
    engine.start_session("s", "wf")
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        call(engine)
    assert raised.value.field == "reopen_expired"
    assert engine.log.head() == before


@pytest.mark.parametrize(
    "metadata",
    [object(), float("nan"), "text", {"k": float("nan")}],
    ids=["object", "nan", "text", "nan-value"],
)
@pytest.mark.parametrize("command", ["start_session", "restart_session"])
def test_metadata_that_is_no_json_object_is_refused_when_the_session_exists_too(
    engine: Engine, command: str, metadata: Any
) -> None:
    # (A restart of an existing session recorded Restarted whatever the metadata was, and a
    # repeated start answered the session: only a new session's metadata was checked.)
    engine.start_session("s", "wf", user_id="u")
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        getattr(engine, command)("s", "wf", user_id="u", metadata=metadata)
    assert raised.value.field == "metadata"
    assert engine.log.head() == before


@pytest.mark.parametrize("actor", [5, None, "", "a\x00b", "a\ud800", "x" * 201, ["key-1"]], ids=repr)
def test_an_actor_that_is_no_name_is_refused_before_any_command_runs(engine: Engine, actor: Any) -> None:
    # (acting_as took anything: 5, "", NUL and 100,000 characters were recorded on the step's
    # events as its actor, and a lone surrogate failed the save with UnicodeEncodeError.)
    engine.start_session("s", "wf")
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised, engine.acting_as(actor):
        engine.record_step("s", "step")
    assert raised.value.field == "actor"
    assert engine.log.head() == before


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda e, d: e.archive_sessions(5), "out_dir"),
        (lambda e, d: e.archive_sessions(d, batch_size="x"), "batch_size"),
        (lambda e, d: e.archive_sessions(d, batch_size=2.5), "batch_size"),
        (lambda e, d: e.restore_sessions(5), "bundle"),
        (lambda e, d: e.restore_sessions(d / "b.jsonl", sessions="s"), "sessions"),
        # (These were ValueError "embedded null byte" and UnicodeEncodeError from open(), and
        # TypeError "unhashable type: 'list'" from the policy lookup.)
        (lambda e, d: e.restore_sessions(f"{d}/b\x00.jsonl"), "bundle"),
        (lambda e, d: e.restore_sessions(f"{d}/b\ud800.jsonl"), "bundle"),
        (lambda e, d: e.archive_sessions(f"{d}/out\x00"), "out_dir"),
        (lambda e, d: e.archive_sessions(d, workflow=["wf"]), "workflow"),
        (lambda e, d: e.archive_sessions(d, workflow={"wf": 1}, dry_run=True), "workflow"),
        # (TypeError from a comparison, DatatypeMismatch from the insert, a string's characters
        # sent as UUIDs.)
        (lambda e, d: e.retention.set_policy("wf", "90"), "days"),
        (lambda e, d: e.retention.set_policy("wf", True), "days"),
        (lambda e, d: e.retention.bundles_of("x"), "streams"),
        (lambda e, d: e.retention.bundles_of(["x"]), "streams"),
    ],
    ids=[
        "out_dir-int",
        "batch-string",
        "batch-float",
        "bundle-int",
        "sessions-string",
        "bundle-nul",
        "bundle-lone-surrogate",
        "out_dir-nul",
        "workflow-list",
        "workflow-dict",
        "days-string",
        "days-bool",
        "streams-string",
        "streams-not-uuids",
    ],
)
def test_retentions_arguments_of_the_wrong_type_are_refused(
    pg_engine: Engine, tmp_path: Path, call: Any, field: str
) -> None:
    # (out_dir=5 and bundle=5 raised TypeError from pathlib, batch_size="x" TypeError from a
    # comparison.)
    with pytest.raises(ValidationError) as raised:
        call(pg_engine, tmp_path)
    assert raised.value.field == field


@pytest.mark.parametrize("tenant", [None, 5, ""], ids=repr)
def test_a_tenant_engine_for_no_tenant_name_is_refused(tenant: Any) -> None:
    # (None was read as "this engine's tenant": the engine itself came back, and a caller's
    # `with engine.for_tenant(name):` then closed the engine every tenant shares.)
    with Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent"))) as engine:
        with pytest.raises(ValidationError) as raised:
            engine.for_tenant(tenant)
        assert raised.value.field == "tenant"
        engine.start_session("s", "wf")  # still open


def test_a_retention_of_a_fraction_of_days_is_refused_not_rounded(pg_engine: Engine) -> None:
    # (1.5 passed the range check and PostgreSQL rounded it into the integer column: 2 days.)
    with pytest.raises(ValidationError) as raised:
        pg_engine.retention.set_policy("wf", 1.5)  # type: ignore[arg-type]
    assert raised.value.field == "days"
    assert pg_engine.retention.policies() == {}


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Engine(settings="memory:"), "settings"),  # type: ignore[arg-type]
        (
            lambda: Engine("postgresql://u@h/\ud800", settings=Settings(home=Path("/nonexistent"))),
            "database_url",
        ),
    ],
    ids=["settings-string", "url-lone-surrogate"],
)
def test_an_engine_built_from_arguments_of_the_wrong_kind_is_refused(make: Any, field: str) -> None:
    # (AttributeError "'str' object has no attribute 'with_overrides'"; UnicodeEncodeError.)
    with pytest.raises(ValidationError) as raised:
        make()
    assert raised.value.field == field
