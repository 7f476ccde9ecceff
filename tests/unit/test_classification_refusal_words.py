"""A classification's refusal lists the names it takes as a priority's or a status's refusal
does (``must be one of ['low', 'medium', ...]``), not as a Python tuple: ``tasks
record-classification --category poetry`` said ``must be one of ('bug_fix', 'feature', ...)``."""

from __future__ import annotations

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.domain.task_views import Classification
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

CATEGORY = (
    "category: must be one of ['bug_fix', 'feature', 'documentation', 'review', 'deployment', 'research']"
)
COMPLEXITY = "complexity: must be one of ['low', 'medium', 'high', 'critical']"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"category": "poetry", "complexity": "low"}, f"{CATEGORY} (any case), got 'poetry'"),
        ({"category": "feature", "complexity": "huge"}, f"{COMPLEXITY} (any case), got 'huge'"),
    ],
    ids=["category", "complexity"],
)
def test_the_refusal_lists_the_names_as_a_priority_s_does(fields: dict[str, str], said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Classification(estimated_hours=1.0, **fields)
    assert str(refused.value) == said


def test_the_command_line_says_it_so(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.create_task("t1", "Fix it", [])
    args = [
        "tasks",
        "record-classification",
        "t1",
        "--category",
        "poetry",
        "--complexity",
        "low",
        "--hours",
        "1",
    ]
    refused = run_cli(database_url, pg_schema, *args)
    assert (refused.returncode, refused.stderr) == (2, f"error: {CATEGORY} (any case), got 'poetry'\n")
