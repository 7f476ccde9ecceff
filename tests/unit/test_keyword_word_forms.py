"""A description naming its stack as a verb made of the keyword is routed by that keyword.

"Dockerize the service" and "Containerize the billing app", created without skills and
classified `feature` by the simulator, went to Backend by their category alone (python): the
catalogue knows ``docker`` and ``container`` but read only the word as written and its plural.
The ``-ize`` / ``-ise`` family (and its ``-ized``, ``-izing``, ``-ization`` forms) of a lower-case
keyword names the keyword's stack; other endings (``-ed``, ``-ing``) are not read, since
"composed" or "paged" would then name docker or react.
"""

from __future__ import annotations

import pytest

from flowledger.domain.skills import SkillCatalogue
from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_skill_catalogue


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Dockerize the service", ("docker",)),
        ("Dockerise the service", ("docker",)),
        ("Containerize the billing app", ("docker",)),
        ("The containerized build is broken", ("docker",)),
        ("Deploy the containerised worker", ("docker",)),
        ("Dockerizing the API", ("docker", "python")),
        ("Plan the containerization of the monolith", ("docker",)),
        ("Componentize the settings form", ("react",)),
        ("DOCKERIZES nightly", ("docker",)),
    ],
)
def test_a_keyword_made_a_verb_names_its_stack(description: str, skills: tuple[str, ...]) -> None:
    # The category (feature: python) would give python to every one of them.
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason
    assert "no known word" not in reason


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("The page is composed of three panels", ("react",)),  # 'page'; 'composed' is no 'compose'
        ("Fix the paging of the search results", ("python",)),  # 'paging' is no 'page'
        ("Users reacted badly to the change", ("python",)),  # 'reacted' is no 'react'
        ("Raise the size of the log files", ("python",)),  # '-ise' words that name no keyword
        ("Revise the premise of the expertise page", ("react",)),
        ("Goize the worker", ("python",)),  # 'Go' matches only as written
    ],
)
def test_other_word_forms_name_no_stack(description: str, skills: tuple[str, ...]) -> None:
    assert load_skill_catalogue().skills_for("bug_fix", description)[0] == skills


def test_a_custom_catalogues_keywords_are_read_as_verbs_too() -> None:
    catalogue = SkillCatalogue.from_data(
        {
            "version": "t-1",
            "categories": {
                name: ["python"]
                for name in ("bug_fix", "feature", "documentation", "review", "deployment", "research")
            },
            "keywords": {"serverless": ["aws"], "tokenizer": ["nlp"]},
        }
    )
    assert catalogue.skills_for("feature", "Serverlessize the cron jobs")[0] == ("aws",)
    assert catalogue.skills_for("feature", "Retrain the tokenizers")[0] == ("nlp",)


def test_a_task_to_dockerize_goes_to_the_team_that_covers_docker(engine: Engine) -> None:
    # Given the seed's teams and a task created without skills
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"])
    engine.create_task("T-dockerize", "Dockerize the service", [])

    # When a classification is recorded and the task assigned
    engine.record_classification("T-dockerize", "feature", "medium", 4.0)
    assigned = engine.assign_task("T-dockerize")

    # Then DevOps takes it, and the derivation says which word named docker
    assert assigned.agent_id == "devops"
    classified = {e.event_type: e.data for e in engine.task_history("T-dockerize")}["Task.Classified"]
    assert "skills docker from the words 'dockerize'" in classified["derivation"]
