"""Session, task and agent ids that look alike are not taken as two ids: an id with white space
around it, a character drawn as nothing (a zero-width space, a word joiner, a byte-order mark)
or not in Unicode's composed form (NFC) is refused when the session, task or agent is created.
Each was taken: ``look-1`` and ``look-1 `` (or ``look\\u200b-1``, or ``café`` spelt
``cafe\\u0301``) were two sessions shown alike. Ids stored before the rule still load and work."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain.agent import Agent
from flowledger.domain.errors import SessionNotFound, TaskNotFound, ValidationError
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.infrastructure import Engine

LOOKALIKES = [
    ("look-1 ", "white space around it"),
    (" look-1", "white space around it"),
    ("look-1\u3000", "white space around it"),
    ("look\u200b-1", "U+200B"),
    ("look-1\u2060", "U+2060"),
    ("\ufefflook-1", "U+FEFF"),
    ("look\u00ad-1", "U+00AD"),
    (unicodedata.normalize("NFD", "caf\u00e9"), "NFC"),
    # inside it: white space other than one plain space between characters is shown as one
    ("look\u00a01", "U+00A0"),
    ("look\u20031", "U+2003"),
    ("look\u30001", "U+3000"),
    ("look\u20281", "U+2028"),
    ("look  1", "two spaces in a row"),
]


@pytest.mark.parametrize(("bad", "why"), LOOKALIKES, ids=repr)
def test_creating_a_session_task_or_agent_with_an_id_that_looks_like_another_is_refused(
    engine: Engine, bad: str, why: str
) -> None:
    # When each kind of id is created looking like another
    engine.start_session("s-1", "w")
    attempts = {
        "task_id": lambda: engine.create_task(bad, "Fix it"),
        "agent_id": lambda: engine.register_agent(bad, "Ops", ["python"]),
        "session_id": lambda: engine.start_session(bad, "w"),
        "new_session_id": lambda: engine.fork_session("s-1", 1, bad),
    }
    for field, attempt in attempts.items():
        # Then it is refused, naming the field and why
        with pytest.raises(ValidationError, match=re.escape(why)) as raised:
            attempt()
        assert raised.value.field == field
    # And nothing was recorded
    with pytest.raises(TaskNotFound):
        engine.get_task(bad)
    assert engine.list_agents() == []
    with pytest.raises(SessionNotFound):
        engine.get_session(bad)


@pytest.mark.parametrize("good", ["look 1", "a b c", "caf\u00e9", "ключ-7", "用户-42", "a.b_c-d"])
def test_ids_with_inner_spaces_and_composed_letters_of_any_script_are_taken(
    engine: Engine, good: str
) -> None:
    assert engine.start_session(good, "w").session_id == good
    assert engine.create_task(good, "Fix it").task_id == good
    assert engine.register_agent(good, "Ops", ["python"]).agent_id == good


def test_lookalike_ids_stored_before_the_rule_still_load_and_work(engine: Engine) -> None:
    # Given a session, an agent and a task whose ids would be refused now, written before the
    # rule (their created events, built without the public commands' checks)
    tenant, soon = engine.tenant, datetime.now(UTC) + timedelta(hours=1)
    session_id, agent_id, task_id = "u-1 ", "ops\u200b", unicodedata.normalize("NFD", "caf\u00e9")
    engine.store.app.save(
        Session(
            session_id=session_id, tenant=tenant, workflow="w", user_id=None, expires_at=soon, metadata={}
        ),
        Agent(agent_id=agent_id, tenant=tenant, name="Ops", skills=["python"], capacity=1),
        Task(
            task_id=task_id,
            tenant=tenant,
            description="Fix it",
            required_skills=["python"],
            priority="medium",
            deadline=soon,
        ),
    )
    # When they are read and worked on now
    engine.record_step(session_id, "greet", {"message": "hi"}, {"reply": "hello"})
    assert engine.get_session(session_id).step_count == 1
    assert engine.assign_task(task_id).agent_id == agent_id
    # Then they are the ids stored, not their look-alikes
    with pytest.raises(SessionNotFound):
        engine.get_session("u-1")


def test_an_id_with_inner_white_space_stored_before_the_rule_still_loads_and_works(engine: Engine) -> None:
    # Given a session whose id holds a no-break space, written before the rule
    soon = datetime.now(UTC) + timedelta(hours=1)
    stored = "u\u00a01"
    engine.store.app.save(
        Session(
            session_id=stored, tenant=engine.tenant, workflow="w", user_id=None, expires_at=soon, metadata={}
        )
    )
    # When a step is recorded on it and it is read
    engine.record_step(stored, "greet", {"message": "hi"}, {"reply": "hello"})
    # Then it is that session, and the id with a plain space is another (none)
    assert engine.get_session(stored).step_count == 1
    with pytest.raises(SessionNotFound):
        engine.get_session("u 1")
