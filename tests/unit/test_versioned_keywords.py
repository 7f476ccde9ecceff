"""A keyword written with its version joined to it names its stack, as it does alone.

"Migrate to Vue3", "HTML5 video player", "CSS3 animations" and "Move to React18", created
without skills and classified ``feature``, derived python from their category alone ("no known
word in the description") and went to Backend; "Terraform1.6 upgrade" too, and "Bump go1.22 to
go1.23" named no language: the catalogue read ``vue3`` as one word that no keyword is.
"""

from __future__ import annotations

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_skill_catalogue


@pytest.mark.parametrize(
    ("description", "skills", "word"),
    [
        ("Migrate to Vue3", ("vue",), "vue3"),
        ("HTML5 video player", ("css",), "html5"),
        ("CSS3 animations", ("css",), "css3"),
        ("Move to React18", ("react",), "react18"),
        ("Terraform1.6 upgrade", ("terraform",), "terraform1.6"),
        ("Port the scripts to Python3", ("python",), "python3"),
        ("Upgrade python3.12", ("python",), "python3.12"),
        ("Helm3 charts", ("kubernetes",), "helm3"),
        ("Use k8s1.29", ("kubernetes",), "k8s1.29"),
        ("Bump go1.22 to go1.23", ("golang",), "go1.22"),  # the toolchain's own spelling
        ("Upgrade to Go1.23", ("golang",), "go1.23"),
    ],
)
def test_a_keyword_with_its_version_joined_names_its_stack(
    description: str, skills: tuple[str, ...], word: str
) -> None:
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason
    assert f"'{word}'" in reason


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Store it as base64", ("python",)),  # a version joined to no keyword
        ("Move the bucket from s3 to s33", ("aws",)),  # 's3' itself; 's33' is no version of it
        ("Rotate the ec21 keys", ("python",)),  # a keyword ending in a digit takes no version
    ],
)
def test_only_a_version_joined_to_a_keyword_is_read(description: str, skills: tuple[str, ...]) -> None:
    assert load_skill_catalogue().skills_for("feature", description)[0] == skills


def test_a_task_for_vue3_goes_to_the_frontend(engine: Engine) -> None:
    # Given the seed's teams and a task created without skills
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"])
    engine.register_agent("frontend", "Frontend", ["react", "vue", "css"])
    engine.create_task("T-vue3", "Migrate the settings page to Vue3", [])

    # When a classification is recorded and the task assigned
    engine.record_classification("T-vue3", "feature", "medium", 4.0)

    # Then Frontend takes it
    assert engine.assign_task("T-vue3").agent_id == "frontend"
