"""``Go`` the verb, written as titles, bullets and compounds write it, names no language.

The catalogue reads a sentence's capitalised first word before ``over``, ``live``, ``to`` and
the like as the verb, but only with that follower in lower case and the sentence begun by
nothing or by ``.!?;:``: "Go Live checklist for the billing app" (a title) derived golang and
went to Backend, as did "- Go over the plan" (a bullet), "(Go over the plan)", and the
compounds "Prepare the Go-Live of the shop" and "Go-to-market page".
"""

from __future__ import annotations

import pytest

from flowledger.infrastructure.router_files import load_skill_catalogue


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Go Live checklist for the billing app", ("python",)),  # the category: no known word
        ("Go Over The Terraform State", ("terraform",)),
        ("GO LIVE with the new S3 bucket", ("aws",)),
        ("- Go over the Terraform state", ("terraform",)),
        ("* Go live with the new page", ("react",)),
        ("(Go over the plan)", ("python",)),
        ('"Go live" checklist', ("python",)),
        ("Prepare the Go-Live of the shop", ("python",)),
        ("Go-live page for the shop", ("react",)),
        ("Go-to-market page", ("react",)),
    ],
)
def test_go_the_verb_names_no_language(description: str, skills: tuple[str, ...]) -> None:
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Go Service Crashes On Start", ("golang",)),  # a title naming the language
        ("- Go service crashes on start", ("golang",)),
        ("Go-based worker for the queue", ("golang",)),
        ("Go-Kubernetes operator", ("golang", "kubernetes")),
        ("Upgrade Go to 1.22", ("golang",)),  # mid-sentence: the language, whatever follows
        ("Rewrite the worker in Go.", ("golang",)),
        ("The Go SDK", ("golang",)),
    ],
)
def test_go_the_language_still_names_golang(description: str, skills: tuple[str, ...]) -> None:
    derived, reason = load_skill_catalogue().skills_for("feature", description)
    assert derived == skills, reason
