"""Skills spelt two common ways are one skill wherever skills are compared: the catalogue's
``aliases`` (data, versioned with it) name the other spellings of a skill (golang: go,
kubernetes: k8s, javascript: js, typescript: ts, postgresql: postgres). A task naming
"golang" was escalated ``no_capable_agent`` beside an idle agent registered with "go"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowledger.domain.assignment import AgentProfile, Needs, choose_agent
from flowledger.domain.errors import ValidationError
from flowledger.domain.skill_aliases import SkillAliases
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.router_files import load_skill_catalogue

SHIPPED = Path(__file__).parents[2] / "infrastructure" / "skills.json"
PAIRS = [
    ("golang", "go"),
    ("kubernetes", "k8s"),
    ("javascript", "js"),
    ("typescript", "ts"),
    ("postgresql", "postgres"),
]


@pytest.mark.parametrize(("skill", "alias"), PAIRS, ids=[alias for _, alias in PAIRS])
def test_the_shipped_catalogue_names_the_common_aliases(skill: str, alias: str) -> None:
    aliases = load_skill_catalogue().skill_aliases
    assert aliases.equivalents(skill) == {skill, alias}
    assert aliases.equivalents(alias) == {skill, alias}


@pytest.mark.parametrize("task_names", [True, False], ids=["task-golang", "task-go"])
def test_a_task_goes_to_the_agent_that_spells_its_skill_the_other_way(
    engine: Engine, task_names: bool
) -> None:
    # Given an agent with one spelling and a task naming the other
    agent_skill, task_skill = ("go", "golang") if task_names else ("golang", "go")
    engine.register_agent("gopher", "Gopher", [agent_skill, "python"], capacity=2)
    engine.register_agent("web", "Web", ["react"], capacity=2)
    engine.create_task("T-1", "Fix the race in the worker", [task_skill])

    # When it is assigned
    state = engine.assign_task("T-1")

    # Then the agent covering it under the other name takes it, the reason naming both spellings
    assert (state.status, state.agent_id) == (TaskStatus.ASSIGNED, "gopher")
    assert state.assignment is not None
    assert state.assignment.reason.startswith(f"covers {task_skill} (as {agent_skill});")


def test_a_skill_held_as_named_is_named_alone(engine: Engine) -> None:
    engine.register_agent("gopher", "Gopher", ["go", "golang"], capacity=1)
    engine.create_task("T-1", "Fix the race in the worker", ["golang"])
    state = engine.assign_task("T-1")
    assert state.assignment is not None
    assert state.assignment.reason.startswith("covers golang;")


def test_a_queue_run_and_derived_skills_resolve_aliases_too(engine: Engine) -> None:
    engine.register_agent("ops", "Ops", ["k8s"], capacity=2)
    engine.register_agent("web", "Web", ["react"], capacity=2)
    engine.create_task("T-named", "Tune the probes", ["Kubernetes"])
    engine.create_task("T-derived", "Tune the Kubernetes probes", [])
    engine.record_classification("T-derived", "deployment", "low", 2.0)

    offered = engine.assign_pending()

    assert {(s.task_id, s.agent_id) for s in offered} == {("T-named", "ops"), ("T-derived", "ops")}


def test_unrelated_names_stay_apart(engine: Engine) -> None:
    engine.register_agent("jvm", "JVM", ["java"], capacity=2)
    engine.create_task("T-js", "Fix the widget", ["javascript"])
    state = engine.assign_task("T-js")
    assert state.status is TaskStatus.ESCALATED


def test_the_policy_counts_an_alias_once_toward_coverage() -> None:
    aliases = SkillAliases.of({"golang": ["go"]})
    agents = [
        AgentProfile(agent_id="a", skills=frozenset({"go"}), capacity=1, load=0),
        AgentProfile(agent_id="b", skills=frozenset({"go", "golang", "python"}), capacity=1, load=0),
    ]
    needs = Needs.of(["golang", "python"]).spelt(aliases)
    decision = choose_agent("t", needs, agents)
    assert getattr(decision, "agent_id", None) == "b"
    assert Needs.of(["golang"]).spelt(aliases).met_by({"go"})


def _catalogue_with(tmp_path: Path, aliases: object) -> Path:
    data = json.loads(SHIPPED.read_text())
    data["aliases"] = aliases
    path = tmp_path / "skills.json"
    path.write_text(json.dumps(data))
    return path


def test_a_catalogue_file_may_name_its_own_aliases(tmp_path: Path) -> None:
    path = _catalogue_with(tmp_path, {"golang": ["go"], "rust": ["rust-lang"]})
    with Engine.in_memory(settings=Settings(skill_catalogue_file=path)) as engine:
        engine.register_agent("r", "Rustacean", ["rust-lang"], capacity=1)
        engine.create_task("T", "Fix the borrow", ["Rust"])
        assert engine.assign_task("T").agent_id == "r"


@pytest.mark.parametrize(
    ("aliases", "field", "said"),
    [
        ({"golang": ["go"], "gopher": ["go"]}, "skill_catalogue.aliases.gopher", "'go' is named twice"),
        ({"golang": ["go"], "go": ["go-lang"]}, "skill_catalogue.aliases.go", "'go' is named twice"),
        ({"golang": []}, "skill_catalogue.aliases.golang", "at least one"),
        ({"golang": "go"}, "skill_catalogue.aliases.golang", "list of skill names"),
        (["golang"], "skill_catalogue.aliases", "must be an object"),
    ],
    ids=["alias-twice", "alias-a-skill", "empty", "not-a-list", "not-an-object"],
)
def test_a_catalogue_whose_aliases_are_ambiguous_is_refused(
    tmp_path: Path, aliases: object, field: str, said: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        load_skill_catalogue(_catalogue_with(tmp_path, aliases))
    assert refused.value.field == field, refused.value
    assert said in str(refused.value)
