"""Registering an agent takes at least one skill and a capacity of at least 1, through the
library as through REST (the rule lives in the domain): an agent that can take no task is not
registered. Pausing one later (capacity 0) is still allowed, and agents stored before the rule
with no skills or capacity 0 still load, replay and work."""

from __future__ import annotations

from typing import Any

import pytest

from flowledger.domain.agent import Agent
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine

UNFIT = [({"skills": []}, "skills"), ({"capacity": 0}, "capacity")]


@pytest.mark.parametrize(("change", "field"), UNFIT, ids=["no-skills", "capacity-0"])
def test_an_agent_with_no_skills_or_no_capacity_is_not_registered(
    engine: Engine, change: dict[str, Any], field: str
) -> None:
    # Given an engine with nothing recorded
    before = engine.log.head()
    # When an agent is registered with no skills, or room for no task
    with pytest.raises(ValidationError) as raised:
        engine.register_agent("a1", **{"name": "A", "skills": ["go"], "capacity": 3, **change})
    # Then the field is named, and nothing was appended
    assert raised.value.field == field
    assert engine.log.head() == before
    assert engine.list_agents() == []


@pytest.mark.parametrize(("change", "field"), UNFIT, ids=["no-skills", "capacity-0"])
def test_the_domain_is_where_the_registration_rule_lives(change: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"agent_id": "a1", "tenant": "t", "name": "A", "skills": ["go"], "capacity": 3}
    with pytest.raises(ValidationError) as raised:
        Agent.register(**{**fields, **change})
    assert raised.value.field == field


def test_a_registered_agent_may_still_be_paused_with_capacity_zero(engine: Engine) -> None:
    engine.register_agent("a1", "A", ["go"], 1)
    assert engine.set_agent_capacity("a1", 0).capacity == 0
    engine.create_task("t1", "something", ["go"])
    assert engine.assign_task("t1", escalate_when_full=False).agent_id is None


def test_agents_stored_before_the_rule_with_no_skills_or_capacity_zero_still_load_and_work(
    engine: Engine,
) -> None:
    # Given agents whose Registered events were written before the rule (built without the
    # public command's checks, as an old log holds them)
    tenant = engine.tenant
    engine.store.app.save(
        Agent(agent_id="idle", tenant=tenant, name="Idle", skills=["go"], capacity=0),
        Agent(agent_id="blank", tenant=tenant, name="Blank", skills=[], capacity=2),
    )
    # When they are read, replayed to their first version, and worked on
    idle, blank = engine.get_agent("idle"), engine.get_agent("blank")
    assert (idle.capacity, blank.skills) == (0, ())
    assert engine.get_agent("idle", version=1) == idle
    assert [a.agent_id for a in engine.list_agents()] == ["idle", "blank"]
    engine.set_agent_capacity("idle", 1)
    engine.create_task("t1", "something", ["go"])
    # Then the paused agent, given room, takes the task
    assert engine.assign_task("t1").agent_id == "idle"


@pytest.mark.parametrize(("change", "field"), UNFIT, ids=["no-skills", "capacity-0"])
def test_registering_an_agent_stored_before_the_rule_again_with_its_unfit_fields_is_refused(
    engine: Engine, change: dict[str, Any], field: str
) -> None:
    # Given an agent stored before the rule with no skills, or capacity 0
    fields: dict[str, Any] = {"name": "Old", "skills": ["go"], "capacity": 3, **change}
    engine.store.app.save(Agent(agent_id="old", tenant=engine.tenant, **fields))
    stored = engine.get_agent("old")
    # When it is registered again with those same fields
    with pytest.raises(ValidationError) as raised:
        engine.register_agent("old", **fields)
    # Then the command is refused as any registration with them is (not a silent success),
    # and the stored agent is as it was
    assert raised.value.field == field
    assert engine.get_agent("old") == stored
