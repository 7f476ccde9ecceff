"""A skill catalogue file that would route tasks other than it says is refused when loaded,
naming the field: a misspelt field, an entry naming no skill, a keyword no description can
hold, a skill no agent could be registered with, a category named twice, a bad floor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.router_files import load_skill_catalogue

SHIPPED = Path(__file__).parents[2] / "infrastructure" / "skills.json"


def _shipped() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SHIPPED.read_text())
    return data


def _with(**changes: Any) -> dict[str, Any]:
    data = _shipped()
    for key, value in changes.items():
        if key.startswith("drop_"):
            del data[key.removeprefix("drop_")]
        else:
            data[key] = value
    return data


def _categories(**changes: Any) -> dict[str, Any]:
    return {**_shipped()["categories"], **changes}


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        (
            _with(drop_keywords=True, keyword=_shipped()["keywords"]),
            "skill_catalogue",
            r"unknown fields \['keyword'\]",
        ),
        (_with(keywords={"python": []}), "skill_catalogue.keywords.python", "at least one skill"),
        (
            _with(categories=_categories(research=[])),
            "skill_catalogue.categories.research",
            "at least one skill",
        ),
        (
            _with(keywords={"machine learning": ["python"]}),
            "skill_catalogue.keywords.machine learning",
            "one word",
        ),
        (_with(keywords={"k8s!": ["kubernetes"]}), "skill_catalogue.keywords.k8s!", "one word"),
        (_with(keywords={"Überwachung": ["aws"]}), "skill_catalogue.keywords.Überwachung", "one word"),
        (_with(keywords={"": ["python"]}), "skill_catalogue.keywords.", "one word"),
        (_with(categories=_categories(research=["a\x00b"])), "skill_catalogue.categories.research", "NUL"),
        (_with(categories=_categories(research=["x" * 201])), "skill_catalogue.categories.research", "200"),
        (_with(categories=_categories(BUG_FIX=["golang"])), "skill_catalogue.categories.BUG_FIX", "twice"),
        (_with(priority_floors={"high": 7}), "skill_catalogue.priority_floors.high", "got 7"),
        (_with(priority_floors={"high": None}), "skill_catalogue.priority_floors.high", "got None"),
        (_with(version="v\x001"), "skill_catalogue.version", "NUL"),
        (_with(version="v" * 201), "skill_catalogue.version", "200"),
    ],
)
def test_a_catalogue_that_would_route_otherwise_than_it_says_is_refused_naming_the_field(
    tmp_path: Path, data: dict[str, Any], field: str, says: str
) -> None:
    # Given a catalogue file with one fault
    path = tmp_path / "skills.json"
    path.write_text(json.dumps(data))
    # When it is loaded, Then it is refused, naming the field and what is wrong
    with pytest.raises(ValidationError, match=says) as refused:
        load_skill_catalogue(path)
    assert refused.value.field == field


def test_the_shipped_catalogue_and_its_skills_pass_the_same_rules(tmp_path: Path) -> None:
    catalogue = load_skill_catalogue()
    path = tmp_path / "skills.json"
    path.write_text(json.dumps(_with(categories=_categories(research=[" Python ", "PYTHON"]))))
    assert load_skill_catalogue(path).categories["research"] == ("python",)
    assert all(skills for skills in catalogue.keywords.values())
    assert catalogue.skills_for("bug_fix", "Fix the race in the Go worker")[0] == ("golang",)
