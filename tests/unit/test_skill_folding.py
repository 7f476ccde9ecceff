"""A skill has one spelling: Unicode NFKC with case folded, for agents, tasks, the catalogue's
keywords and skills, and the words of a description; events stored under the older rule
(``.strip().lower()``) still fold to the state they gave."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from flowledger.domain.agent import Agent, fold_skill, normalise_skills, stored_skills
from flowledger.domain.errors import ValidationError
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task import Task
from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_skill_catalogue

WIDE_KUBERNETES = "".join(chr(ord(c) + 0xFEE0) for c in "Kubernetes")
"""'Kubernetes' in full-width letters (U+FF2B ...)."""
FI_LIGATURE = "\ufb01"
CAFE_NFC = unicodedata.normalize("NFC", "caf\u00e9")
CAFE_NFD = unicodedata.normalize("NFD", "caf\u00e9")
OLD_RULE = str.lower  # what .strip().lower() stored (the names below have no spaces)


@pytest.mark.parametrize(
    ("spellings", "one"),
    [
        (
            ["kubernetes", "Kubernetes", "KUBERNETES", WIDE_KUBERNETES, f" {WIDE_KUBERNETES}\u3000"],
            "kubernetes",
        ),
        (["file", "FILE", f"{FI_LIGATURE}le"], "file"),
        (["strasse", "STRASSE", "stra\u00dfe", "STRA\u1e9eE"], "strasse"),
        ([CAFE_NFC, CAFE_NFD, CAFE_NFC.upper(), CAFE_NFD.upper()], CAFE_NFC),
    ],
)
def test_every_spelling_of_a_skill_is_one_skill(spellings: list[str], one: str) -> None:
    assert normalise_skills("skills", spellings) == [one]
    assert all(fold_skill(s) == one for s in spellings)
    assert fold_skill(one) == one  # folding is stable


def test_an_ascii_name_folds_as_the_older_rule_made_it() -> None:
    for name in ["python", "Python", " Go ", "c++", "node.js", "C#"]:
        assert fold_skill(name) == name.strip().lower()


def test_a_name_folding_beyond_the_length_limit_is_refused_in_one_clear_line() -> None:
    # U+FDFA is one character and eighteen once folded: twelve of them are 216
    with pytest.raises(ValidationError, match=r"at most 200 characters once folded .*got 216"):
        normalise_skills("skills", ["\ufdfa" * 12])


def test_old_events_fold_to_the_state_they_gave() -> None:
    # An ASCII list as stored (even one out of order) comes back as it was
    assert stored_skills(["python", "golang"]) == ["python", "golang"]
    agent = Agent(agent_id="be", tenant="t", name="Backend", skills=["python", "golang"], capacity=2)
    assert agent.skills == ["python", "golang"]

    # A non-ASCII name stored by the older rule (full-width lower case, decomposed, sharp s)
    # reads in the new spelling, so a new registration or task spelling it otherwise matches
    old = [OLD_RULE(WIDE_KUBERNETES), OLD_RULE(CAFE_NFD), "stra\u00dfe", "python"]
    agent = Agent(agent_id="be", tenant="t", name="Backend", skills=old, capacity=2)
    assert agent.skills == [CAFE_NFC, "kubernetes", "python", "strasse"]
    agent.ensure_same(name="Backend", skills=["Kubernetes", CAFE_NFC, "STRASSE", "Python"], capacity=2)
    replayed = None
    for stored in agent.collect_events():
        replayed = stored.mutate(replayed)
    assert isinstance(replayed, Agent)
    assert replayed.skills == agent.skills


def test_the_catalogue_reads_descriptions_and_keywords_in_one_spelling(tmp_path: Path) -> None:
    shipped = load_skill_catalogue()
    wide_go = "".join(chr(ord(c) + 0xFEE0) for c in "Go")
    assert shipped.skills_for("bug_fix", f"Restart the {WIDE_KUBERNETES} pod")[0] == ("kubernetes",)
    assert shipped.skills_for("bug_fix", f"Fix the race in the {wide_go} worker")[0] == ("golang",)
    assert shipped.skills_for("feature", f"Add a {FI_LIGATURE}le upload to the React page")[0] == ("react",)

    categories = {
        c: ["python"] for c in ["bug_fix", "feature", "documentation", "review", "deployment", "research"]
    }
    data = {
        "version": "u-1",
        "categories": categories,
        "keywords": {WIDE_KUBERNETES: ["K8S"], "caf": ["CAF\u00c9"]},
    }
    catalogue = SkillCatalogue.from_data(data)
    assert catalogue.keywords == {"Kubernetes": ("k8s",), "caf": (CAFE_NFC,)}
    assert catalogue.skills_for("deployment", f"Roll out {WIDE_KUBERNETES}")[0] == ("k8s",)

    # Two spellings of one keyword are one key, named twice
    twice = {**data, "keywords": {"kubernetes": ["k8s"], OLD_RULE(WIDE_KUBERNETES): ["k8s"]}}
    with pytest.raises(ValidationError, match="names 'kubernetes' twice"):
        SkillCatalogue.from_data(twice)
    path = tmp_path / "skills.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert load_skill_catalogue(path).keywords["Kubernetes"] == ("k8s",)


def test_an_agent_and_a_task_spelling_a_skill_differently_are_matched(engine: Engine) -> None:
    engine.register_agent("be", "Backend", [WIDE_KUBERNETES, CAFE_NFD], 2)
    assert engine.get_agent("be").skills == (CAFE_NFC, "kubernetes")
    created = engine.create_task("T-1", "Scale the cluster", ["KUBERNETES", CAFE_NFC.upper()])
    assert created.required_skills == (CAFE_NFC, "kubernetes")
    assert engine.assign_task("T-1").agent_id == "be"
    # Registering again in another spelling is the same agent, not a conflict
    assert not engine.register_or_get_agent("be", "Backend", ["kubernetes", CAFE_NFC], 2).created


@pytest.mark.parametrize("invisible", ["\u200b", "\ufeff", "\u200b\u2060\u00ad", "\u202e"])
def test_a_skill_drawn_as_nothing_is_refused(invisible: str) -> None:
    # An outside probe registered an agent whose only skill was a zero-width space (201)
    with pytest.raises(ValidationError, match=r"skills: must hold a visible character"):
        normalise_skills("skills", ["python", invisible])


def test_characters_drawn_as_nothing_are_no_part_of_a_skill() -> None:
    assert normalise_skills("skills", ["py\u200bthon", "\ufeffPython", "PY\u00adTHON"]) == ["python"]
    assert load_skill_catalogue().skills_for("bug_fix", "Restart the Kuber\u200bnetes pod")[0] == (
        "kubernetes",
    )
    # one stored before made only of them keeps its stored spelling; others lose them
    assert stored_skills(["\u200b", "py\u200bthon"]) == ["python", "\u200b"]


def test_an_old_log_spelling_a_skill_the_older_way_matches_new_spellings(engine: Engine) -> None:
    # Given an agent and a task stored under the older rule (.strip().lower()), as an old log
    # holds them: full-width lower-case letters, a decomposed accent, a sharp s
    engine.store.app.save(
        Agent(
            agent_id="old", tenant=engine.tenant, name="Old", skills=[OLD_RULE(WIDE_KUBERNETES)], capacity=2
        ),
        Task(
            task_id="old-t",
            tenant=engine.tenant,
            description="Fix the street map",
            required_skills=[OLD_RULE(CAFE_NFD), "stra\u00dfe"],
            priority="medium",
            deadline=None,
        ),
    )
    # When they are read, and work meets them spelt the new way
    assert engine.get_agent("old").skills == ("kubernetes",)
    assert engine.get_task("old-t").required_skills == (CAFE_NFC, "strasse")
    engine.register_agent("new", "New", ["STRASSE", CAFE_NFC.upper()], 2)
    engine.create_task("new-t", "Scale the cluster", ["Kubernetes"])
    # Then each finds the other: the queue (its index folds the old task) and a direct assignment
    assert {t.task_id: t.agent_id for t in engine.assign_pending()} == {"old-t": "new", "new-t": "old"}
