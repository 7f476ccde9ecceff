"""Routing's ``model_ranked_matching``: the model breaks ties between agents the rule finds
equally good, its call's usage on the assignment; off by default; a failed or unusable call
leaves the rule to decide (``infrastructure/engine/ranking.py``). The simulator's answer to
the same prompt is checked at the end, and over REST in tests/e2e/test_http_tasks.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowledger.adapters.simulator.replies import step_decision
from flowledger.domain.assignment import AgentProfile, Choice, choose_agent, tied_best
from flowledger.domain.errors import LlmCallFailed, ValidationError
from flowledger.domain.prompts import parse_ranking_reply, ranking_messages
from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.ranking import Ranking
from flowledger.projections.calls import call_of
from tests.conftest import make_settings
from tests.support.llm import USAGE, ScriptedLlm
from tests.support.ranking import ranked_routing


def profile(agent_id: str, load: int = 0, skills: tuple[str, ...] = ("go",)) -> AgentProfile:
    return AgentProfile(agent_id=agent_id, skills=frozenset(skills), capacity=4, load=load)


def pick(agent_id: str) -> str:
    return json.dumps({"agent_id": agent_id, "reason": "knows the worker"})


@pytest.fixture
def routing_on(tmp_path: Path) -> Path:
    return ranked_routing(tmp_path)


@pytest.fixture(params=["memory", "postgres"])
def ranked(request: pytest.FixtureRequest, routing_on: Path) -> Iterator[Engine]:
    """An engine with ``model_ranked_matching`` on, two agents the rule cannot tell apart."""
    if request.param == "memory":
        settings = make_settings(database_url="memory:", routing_file=routing_on)
    else:
        url, schema = request.getfixturevalue("database_url"), request.getfixturevalue("pg_schema")
        settings = make_settings(database_url=url, schema=schema, routing_file=routing_on)
    engine = Engine(settings=settings)
    engine.register_agent("ann", "Ann", ["golang"], 5)
    engine.register_agent("bob", "Bob", ["golang"], 5)
    try:
        yield engine
    finally:
        engine.close()


def rule_pick(engine: Engine, task_id: str) -> str:
    """The agent the rule alone takes for ``task_id`` (its stable hash breaks the tie)."""
    profiles = engine.task_reads.index.agent_profiles()
    decision = choose_agent(task_id, ["golang"], profiles)
    assert isinstance(decision, Choice)
    return decision.agent_id


def test_tied_best_holds_only_the_agents_the_rule_cannot_tell_apart() -> None:
    agents = [profile("a"), profile("b"), profile("c", load=1), profile("d", skills=("py",))]
    assert sorted(p.agent_id for p in tied_best("t", ["go"], agents)) == ["a", "b"]
    assert tied_best("t", ["rust"], agents) == []


def test_a_preference_is_taken_only_among_the_tied() -> None:
    agents = [profile("a"), profile("b"), profile("c", load=1)]
    rule = choose_agent("t", ["go"], agents)
    assert isinstance(rule, Choice)
    other = "b" if rule.agent_id == "a" else "a"
    preferred = choose_agent("t", ["go"], agents, prefer=other)
    assert isinstance(preferred, Choice)
    assert preferred.agent_id == other
    assert preferred.score == rule.score  # tied: the same score, another agent
    # Not among the tied (more loaded), or not an agent at all: the rule decides, unmarked.
    for prefer in ("c", "zed"):
        decision = choose_agent("t", ["go"], agents, prefer=prefer)
        assert decision == rule


def test_a_ranking_reply_must_name_one_of_the_tied_agents() -> None:
    assert parse_ranking_reply(pick("ann"), {"ann", "bob"}).agent_id == "ann"
    assert parse_ranking_reply('{"agent_id": "bob"}', {"ann", "bob"}).reason == "no reason given"
    with pytest.raises(ValidationError, match=r"ranking\.agent_id"):
        parse_ranking_reply(pick("carl"), {"ann", "bob"})
    with pytest.raises(ValidationError, match="not one JSON object"):
        parse_ranking_reply("Bob, clearly.", {"ann", "bob"})


async def test_the_model_breaks_a_tie_and_its_usage_is_on_the_assignment(ranked: Engine) -> None:
    ranked.create_task("t1", "Fix the race in the Go worker", ["golang"], "critical")
    other = "bob" if rule_pick(ranked, "t1") == "ann" else "ann"
    ranked.llm = llm = ScriptedLlm(pick(other), usage=USAGE)

    state = await ranked.assign_task_ranked("t1")

    assert state.agent_id == other
    assert len(llm.calls) == 1
    assert llm.calls[0].model == "claude-sonnet-4.5"  # the critical tier's model
    assert "Fix the race in the Go worker" in llm.calls[0].messages[-1]["content"]
    assigned = ranked.task_history("t1")[-1]
    assert assigned.event_type == "Task.Assigned"
    assert assigned.data["usage"] == USAGE
    assert assigned.data["reason"].endswith("; the model's pick (claude-sonnet-4.5: knows the worker)")
    # The cost dashboard and the calls view count it as a task's skill-matching call
    events = list(ranked.log.stream(task_uuid(ranked.tenant, "t1")))
    calls = [call for call in map(call_of, events) if call is not None]
    assert [(call.step, call.usage) for call in calls] == [("skill_matching", USAGE)]


async def test_off_by_default_and_without_a_tie_no_call_is_made(ranked: Engine, tmp_path: Path) -> None:
    ranked.llm = llm = ScriptedLlm(pick("ann"), usage=USAGE)
    ranked.register_agent("cat", "Cat", ["python"], 5)
    ranked.create_task("py", "A Python job", ["python"])  # only one agent covers it
    assert (await ranked.assign_task_ranked("py")).agent_id == "cat"
    assert llm.calls == []
    with Engine(settings=make_settings(database_url="memory:")) as plain:  # routing as shipped
        plain.llm = llm
        plain.register_agent("ann", "Ann", ["golang"], 5)
        plain.register_agent("bob", "Bob", ["golang"], 5)
        plain.create_task("t1", "Go work", ["golang"])
        rule = rule_pick(plain, "t1")  # before the assignment changes the loads
        state = await plain.assign_task_ranked("t1")
        assert state.agent_id == rule
        assert llm.calls == []
        assert plain.task_history("t1")[-1].data["usage"] is None


@pytest.mark.parametrize("failure", ["error", "unknown agent"])
async def test_a_failed_or_unusable_ranking_leaves_the_rule_to_decide_and_keeps_its_usage(
    ranked: Engine, failure: str
) -> None:
    ranked.create_task("t1", "Go work", ["golang"])
    rule = rule_pick(ranked, "t1")
    if failure == "error":
        ranked.llm = ScriptedLlm(
            error=LlmCallFailed("HTTP 500", error_type="server_error", attempts=3, usage=USAGE)
        )
    else:
        ranked.llm = ScriptedLlm(pick("carl"), usage=USAGE)

    state = await ranked.assign_task_ranked("t1")

    assert state.agent_id == rule
    assigned = ranked.task_history("t1")[-1]
    assert assigned.data["usage"] == USAGE
    assert "the rule decided" in assigned.data["reason"]
    assert "the model's pick" not in assigned.data["reason"]


async def test_a_task_escalated_after_the_call_keeps_its_usage(ranked: Engine) -> None:
    # Given a tie, and both agents filled by other assignments while the model thinks
    ranked.set_agent_capacity("ann", 1)
    ranked.set_agent_capacity("bob", 1)
    for task_id in ("t1", "x1", "x2"):
        ranked.create_task(task_id, "Go work", ["golang"])

    def fill() -> None:
        ranked.assign_task("x1")
        ranked.assign_task("x2")

    ranked.llm = ScriptedLlm(pick("ann"), usage=USAGE, meanwhile=fill)

    state = await ranked.assign_task_ranked("t1")

    assert state.status.value == "escalated"
    escalated = ranked.task_history("t1")[-1]
    assert escalated.event_type == "Task.Escalated"
    assert escalated.data["usage"] == USAGE


def test_the_reason_says_whether_the_models_pick_was_used() -> None:
    picked = Ranking(agent_id="bob", usage=USAGE, note="m: fits")
    assert picked.explain("bob") == "the model's pick (m: fits)"
    assert picked.explain("ann") == "the model picked bob, not among the best it could take (m: fits)"
    failed = Ranking(agent_id=None, usage=None, note="model ranking on m failed (LlmTimeout)")
    assert failed.explain("ann") == "model ranking on m failed (LlmTimeout), the rule decided"
    # Kept with the call's usage when no assignment took it (Task.RankingDiscarded)
    assert picked.unused("not assigned: x") == "not assigned: x; the model picked bob (m: fits)"
    assert failed.unused("not assigned: x") == "not assigned: x; model ranking on m failed (LlmTimeout)"


def test_the_simulator_picks_the_listed_agent_whose_skills_the_task_names() -> None:
    class Task:
        description = "Roll out the kubernetes operator written in golang"
        required_skills = ("golang",)

    messages = ranking_messages(Task(), [("ann", ["golang", "python"]), ("bob", ["golang", "kubernetes"])])
    answer = step_decision(messages)
    assert answer["agent_id"] == "bob"
    assert (
        parse_ranking_reply(json.dumps(answer), {"ann", "bob"}).reason == "the task names golang, kubernetes"
    )
