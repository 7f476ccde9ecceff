"""A description naming its stack in the plural is routed as in the singular.

The shipped catalogue knows ``container``, ``cluster``, ``stylesheet``, ``button``: "Restart the
crashed containers", a bug_fix created without skills, was routed by its category alone
(python, to Backend), as "Scale the clusters" and "Fix the stylesheets" were.
"""

from __future__ import annotations

import pytest

from flowledger.domain.skills import SkillCatalogue
from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_skill_catalogue


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Restart the crashed containers", ("docker",)),
        ("Rewrite the Dockerfiles", ("docker",)),
        ("Fix the CI pipelines", ("docker",)),
        ("Scale the clusters", ("kubernetes",)),
        ("Route the ingresses by host", ("kubernetes",)),
        ("Fix the stylesheets", ("css",)),
        ("Add buttons to the toolbar", ("react",)),
        ("Close the modals on escape", ("react",)),
        ("Write Lambdas for the ETL", ("aws",)),
        ("Add two endpoints for orders", ("python",)),
        ("Version the REST APIs", ("python",)),
        ("Move the layouts to grid", ("css",)),
    ],
)
def test_a_keyword_written_in_the_plural_names_its_stack(description: str, skills: tuple[str, ...]) -> None:
    # The category (review: python) would give python to every one of them.
    derived, reason = load_skill_catalogue().skills_for("review", description)
    assert derived == skills, reason
    assert "no known word" not in reason


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Goes down every night", ("python",)),  # 'Go' matches only as written, no plural of it
        ("The CI goes red", ("docker",)),  # ci; 'goes' names no language
        ("It uses too much memory", ("python",)),  # no keyword is 'use' or 'us'
        ("Fix the AWS bill", ("aws",)),  # a keyword ending in s is itself
        ("Tidy the CSS", ("css",)),
    ],
)
def test_only_a_lower_case_keyword_is_read_in_the_plural(description: str, skills: tuple[str, ...]) -> None:
    assert load_skill_catalogue().skills_for("bug_fix", description)[0] == skills


def test_a_custom_catalogues_keywords_are_read_in_the_plural_too() -> None:
    catalogue = SkillCatalogue.from_data(
        {
            "version": "t-1",
            "categories": {
                name: ["python"]
                for name in ("bug_fix", "feature", "documentation", "review", "deployment", "research")
            },
            "keywords": {"notebook": ["jupyter"], "index": ["search"]},
        }
    )
    assert catalogue.skills_for("feature", "Clean the notebooks")[0] == ("jupyter",)
    assert catalogue.skills_for("feature", "Rebuild the indexes")[0] == ("search",)


def test_a_task_naming_its_stack_in_the_plural_goes_to_the_team_that_covers_it(engine: Engine) -> None:
    # Given the seed's teams and a task created without skills
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"])
    engine.create_task("T-containers", "Restart the crashed containers", [])

    # When a classification is recorded and the task assigned
    engine.record_classification("T-containers", "bug_fix", "medium", 2.0)
    assigned = engine.assign_task("T-containers")

    # Then DevOps takes it, and the derivation says which word named docker
    assert assigned.agent_id == "devops"
    classified = {e.event_type: e.data for e in engine.task_history("T-containers")}["Task.Classified"]
    assert "skills docker from the words 'containers'" in classified["derivation"]
