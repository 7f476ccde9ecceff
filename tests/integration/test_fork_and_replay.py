"""Replay never calls the model; a fork starts a new session from a parent's state at a version.

Each test runs on the in-memory and the PostgreSQL backend (the ``engine`` fixture).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain.errors import SessionClosed, SessionConflict, SessionNotFound, ValidationError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.history import jsonable
from flowledger.projections import projector_for
from flowledger.projections.cost_queries import dashboard
from flowledger.projections.funnel_queries import funnel_report
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm


async def test_replay_history_and_fork_never_call_the_model(engine: Engine) -> None:
    # Given a session whose three steps called the (counting) model
    engine.llm = llm = ScriptedLlm()
    engine.start_session("r-1", "customer_service", user_id="u-1")
    for n in range(3):
        await engine.process_step("r-1", f"step_{n}", {"message": f"m{n}"}, idempotency_key=f"k{n}")
    assert len(llm.calls) == 3
    latest = engine.get_session("r-1")

    # When it is replayed at every version, its history and steps are read, and it is forked
    replays = [engine.get_session("r-1", version=v) for v in range(1, latest.version + 1)]
    moment = engine.history("r-1")[2].timestamp
    as_of = engine.get_session("r-1", as_of=moment)
    engine.history("r-1")
    engine.session_steps("r-1")
    engine.fork_session("r-1", latest.version, "r-1-fork")

    # Then the model was not called again, and the replays are the recorded states
    assert len(llm.calls) == 3
    assert replays[-1] == latest
    assert as_of.version == 3
    assert [r.step_count for r in replays] == [0, 0, 1, 1, 2, 2, 3]
    assert replays[-1].totals.calls == 3


async def test_a_step_retried_on_a_fork_with_another_model_is_compared_with_the_parents(
    engine: Engine,
) -> None:
    engine.llm = llm = ScriptedLlm()
    engine.start_session("p-1", "customer_service", user_id="u-1", metadata={"channel": "web"})
    engine.record_step("p-1", "greet", next_step="classify", context_update={"lang": "en"})
    await engine.process_step("p-1", "classify", {"message": "refund"}, model="gpt-4.1", idempotency_key="a")
    at = engine.get_session("p-1", version=2)

    # When the parent is forked at version 2 (before the model step) and the step retried
    fork = engine.fork_session("p-1", 2, "p-1-retry", ttl=timedelta(hours=1))
    await engine.process_step("p-1-retry", "classify", {"message": "refund"}, model="deepseek-v3.2")

    # Then the fork started from the parent's step and context, linked to it, with totals of its own
    assert (fork.forked_from, fork.forked_at_version) == ("p-1", 2)
    assert (fork.current_step, fork.context) == (at.current_step, at.context)
    assert (fork.workflow, fork.user_id, fork.step_count, fork.totals.calls) == (
        "customer_service",
        "u-1",
        0,
        0,
    )
    assert fork.metadata == {"channel": "web", "forked_from": "p-1", "forked_at_version": 2}
    assert [e.event_type for e in engine.history("p-1-retry")][:2] == ["Session.Started", "Session.Forked"]
    assert engine.history("p-1-retry")[1].data["parent_session_id"] == "p-1"
    assert [c.model for c in llm.calls] == ["gpt-4.1", "deepseek-v3.2"]
    assert engine.get_session("p-1-retry").totals.cost_usd == USAGE.cost_usd
    assert engine.get_session("p-1").totals.calls == 1
    assert jsonable(engine.get_session("p-1-retry"))["forked_from"] == "p-1"


@pytest.mark.parametrize(
    ("parent", "version", "new_id", "error", "match"),
    [
        ("nobody", 1, "f-new", SessionNotFound, "'nobody' not found"),
        ("f-1", 0, "f-new", ValidationError, "at_version: must be a version >= 1"),
        ("f-1", 4, "f-new", ValidationError, "at_version: session 'f-1' has 3 versions, not 4"),
        ("f-1", 2, "f-other", SessionConflict, "'f-other' already exists"),
        ("f-1", 2, "f-1", SessionConflict, "'f-1' already exists"),
        ("f-1", 2, "", ValidationError, "new_session_id"),
    ],
)
def test_a_fork_of_bad_input_is_refused_and_appends_nothing(
    engine: Engine, parent: str, version: int, new_id: str, error: type[Exception], match: str
) -> None:
    engine.start_session("f-1", "cs")
    engine.record_step("f-1", "a")
    engine.record_step("f-1", "b")
    engine.start_session("f-other", "cs")
    head = engine.log.head()

    with pytest.raises(error, match=match):
        engine.fork_session(parent, version, new_id)

    assert engine.log.head() == head


def test_a_fork_sent_again_after_its_answer_was_lost_answers_the_fork(engine: Engine) -> None:
    # Given a fork whose answer a client lost (a timeout, a dropped connection) and a step on it
    engine.start_session("g-1", "cs", user_id="u-1")
    engine.record_step("g-1", "a", context_update={"n": 1})
    engine.record_step("g-1", "b", context_update={"n": 2})
    first = engine.fork_session("g-1", 2, "g-1-b")
    engine.record_step("g-1-b", "c")
    head = engine.log.head()

    # When the client sends the same fork again (before: SessionConflict, HTTP 409, exit 4)
    again = engine.fork_session("g-1", 2, "g-1-b")

    # Then it is answered with the fork as it stands, and nothing is appended
    assert again == engine.get_session("g-1-b")
    assert (again.forked_from, again.forked_at_version, again.context) == ("g-1", 2, first.context)
    assert engine.log.head() == head
    # And a fork of another version (or parent) onto that id is still a conflict
    with pytest.raises(SessionConflict, match="'g-1-b' already exists"):
        engine.fork_session("g-1", 3, "g-1-b")


def test_a_fork_of_a_fork_takes_the_state_it_was_forked_with_never_its_half_made_start(
    engine: Engine,
) -> None:
    # Given a fork of a session whose context and step it took in one append (Started, Forked)
    engine.start_session("h-1", "cs", user_id="u-1")
    engine.record_step("h-1", "a", next_step="b", context_update={"order": "A1"})
    engine.fork_session("h-1", 2, "h-2")
    engine.record_step("h-2", "b", context_update={"carrier": "DHL"})
    head = engine.log.head()

    # When the fork is forked at its version 1, its Started alone (init, no context, no parent:
    # before, the grandchild began so, forked_at_version 1, the parent's order lost)
    with pytest.raises(ValidationError, match="at_version: session 'h-2' was forked from 'h-1'") as refused:
        engine.fork_session("h-2", 1, "h-3")

    # Then it is refused, naming the version to fork at, and nothing is appended
    assert "version 2 or later" in str(refused.value)
    assert engine.log.head() == head
    # And at version 2, the state it was forked with, the grandchild takes the parent's context
    grandchild = engine.fork_session("h-2", 2, "h-3")
    assert (grandchild.current_step, grandchild.context) == ("b", {"order": "A1"})
    assert (grandchild.forked_from, grandchild.forked_at_version) == ("h-2", 2)


def test_a_fork_read_at_its_version_1_is_refused_naming_the_version_it_begins_at(engine: Engine) -> None:
    # Given a fork, whose Started and Forked are one append
    engine.start_session("v-1", "cs", user_id="u-1")
    engine.record_step("v-1", "a", next_step="b", context_update={"order": "A1"})
    engine.fork_session("v-1", 2, "v-2")

    # When it is read at its version 1 (its Started alone: it read at init, no context, no
    # parent, a state no reader could have seen)
    with pytest.raises(ValidationError, match="version: session 'v-2' was forked from 'v-1'") as refused:
        engine.get_session("v-2", version=1)

    # Then it is refused, naming the version to read; version 2 and a moment are the whole start
    assert "read version 2 or later" in str(refused.value)
    whole = engine.get_session("v-2", version=2)
    assert (whole.current_step, whole.context, whole.forked_from) == ("b", {"order": "A1"}, "v-1")
    at_start = engine.get_session("v-2", as_of=engine.history("v-2")[0].timestamp)
    assert (at_start.version, at_start.context) == (2, {"order": "A1"})
    # And a session that is no fork still reads at its version 1
    assert engine.get_session("v-1", version=1).current_step == "init"


def test_an_erased_session_cannot_be_forked() -> None:
    with Engine(settings=make_settings(database_url="memory:", seal_personal_data=True)) as engine:
        engine.start_session("e-1", "cs", user_id="gone")
        engine.forget("gone")
        head = engine.log.head()

        with pytest.raises(SessionClosed, match="is erased"):
            engine.fork_session("e-1", 1, "e-2")

        assert engine.log.head() == head


async def test_the_dashboard_and_funnel_compare_a_fork_with_its_parent(pg_engine: Engine) -> None:
    # Given a parent whose step was answered by one model, and a fork that retried it with another
    pg_engine.llm = ScriptedLlm(usage=replace(USAGE, request_model="gpt-4.1"))
    pg_engine.start_session("d-1", "cs", metadata={"channel": "web"})
    await pg_engine.process_step("d-1", "classify", {"m": "x"}, model="gpt-4.1")
    pg_engine.fork_session("d-1", 1, "d-1-b")
    pg_engine.llm = ScriptedLlm(usage=replace(USAGE, request_model="deepseek-v3.2"))
    await pg_engine.process_step("d-1-b", "classify", {"m": "x"}, model="deepseek-v3.2")
    pg_engine.start_session("other", "cs")
    projector = projector_for(pg_engine)
    projector.catch_up()

    # When the dashboard is grouped by session and model, and the funnel by the fork's parent
    with projector.connect() as conn:
        since = datetime(2000, 1, 1, tzinfo=UTC)
        rows = dashboard(conn, projector.names.reader, tenant="default", since=since, by=["session", "model"])
        funnels = funnel_report(
            conn, projector.names.reader, "cs", tenant="default", by="metadata.forked_from"
        )

    # Then each shows the two side by side
    assert sorted(r.group for r in rows) == [("d-1", "gpt-4.1"), ("d-1-b", "deepseek-v3.2")]
    assert {f.segment: f.sessions for f in funnels} == {None: 2, "d-1": 1}
