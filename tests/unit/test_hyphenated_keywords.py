"""A keyword written as a hyphenated compound names its stack, as it does written whole.

"Fix the front-end bug in checkout", created without skills and classified ``feature``, derived
python from its category alone and went to Backend: the catalogue knows ``frontend`` but read
"front-end" only as its parts, "front" and "end", which name nothing. So did "web-pack",
"end-point" and "data-base" (the latter two reaching Backend only by the category's luck).
"""

from __future__ import annotations

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_skill_catalogue


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Fix the front-end bug in checkout", ("react",)),
        ("Fix the Front-End of the shop", ("react",)),
        ("Fix the web-pack build", ("react",)),
        ("Version the end-points", ("python",)),
        ("Data-base migration", ("python",)),
        ("Split the back-end in two", ("python",)),
    ],
)
def test_a_keyword_written_as_a_hyphenated_compound_names_its_stack(
    description: str, skills: tuple[str, ...]
) -> None:
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason
    assert "no known word" not in reason


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Fix the front end of the shop", ("python",)),  # two words: joined, 'the me' would be a theme
        ("Re-act on the pager alert", ("python",)),  # a compound of the verb 'act': no react
        ("Go-Live page", ("react",)),  # the verb's compound stays the verb
    ],
)
def test_only_a_hyphenated_compound_is_joined(description: str, skills: tuple[str, ...]) -> None:
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason


def test_a_front_end_task_goes_to_the_frontend(engine: Engine) -> None:
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.register_agent("frontend", "Frontend", ["react", "vue", "css"])
    engine.create_task("T-fe", "Fix the front-end bug in checkout", [])
    engine.record_classification("T-fe", "bug_fix", "medium", 2.0)
    assert engine.assign_task("T-fe").agent_id == "frontend"
