"""A budget's subject is checked by its scope, in the domain: a session budget names a session
id (no ``/``, not only dots); a model budget names the price table's name (``/`` allowed)."""

from __future__ import annotations

import pytest

from flowledger.domain.budget import BudgetSpec, require_subject
from flowledger.domain.errors import ValidationError


@pytest.mark.parametrize("subject", ["a/b", "ops/1", "/"])
def test_a_session_budget_refuses_a_subject_no_session_id_can_be(subject: str) -> None:
    with pytest.raises(ValidationError) as refused:
        BudgetSpec.of(scope="session", subject=subject, period="day", limit_usd="1")
    assert refused.value.field == "subject"
    assert "session id" in refused.value.message


@pytest.mark.parametrize(
    ("scope", "subject"),
    [
        ("model", "openrouter/deepseek/deepseek-v3.2"),
        ("workflow", "support/tier-1"),
        ("user", "team/alice"),
        ("session", "user-123-1700000000"),
        ("session", "v1.2"),
    ],
)
def test_other_subjects_may_hold_a_slash_as_their_names_may(scope: str, subject: str) -> None:
    spec = BudgetSpec.of(scope=scope, subject=subject, period="day", limit_usd="1")
    assert spec.subject == subject
    assert require_subject(scope, subject) == subject


def test_a_blank_subject_is_refused_in_every_scope() -> None:
    for scope in ("user", "session", "workflow", "model"):
        with pytest.raises(ValidationError, match="subject"):
            require_subject(scope, " ")


@pytest.mark.parametrize("scope", ["user", "session", "workflow", "model"])
@pytest.mark.parametrize("subject", [".", "..", "..."])
def test_a_subject_of_only_dots_is_refused_in_every_scope(scope: str, subject: str) -> None:
    # URL paths address a budget, and clients resolve '.' and '..' segments away
    with pytest.raises(ValidationError) as refused:
        require_subject(scope, subject)
    assert refused.value.field == "subject"
    assert "dots" in refused.value.message
