"""A model's classification names a category of the catalogue however it spells it: case,
spaces, hyphens and underscores are the model's choice, not a different category. A reply of
``"category": "Bug Fix"`` failed the classification (``must be one of ['bug_fix', ...]``), was
retried on the fallback and left the task waiting, paid twice, for a name the catalogue has."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.domain.prompts import parse_classification_reply
from flowledger.domain.task_views import CATEGORIES, TaskStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

USAGE = LlmUsage(
    provider="fake",
    request_model="deepseek-v3.2",
    input_tokens=120,
    output_tokens=30,
    cost_usd=Decimal("0.0000210"),
    latency_ms=41.0,
)


def reply(category: str, complexity: str = "medium") -> str:
    return json.dumps({"category": category, "complexity": complexity, "estimated_hours": 3})


@pytest.mark.parametrize(
    "said",
    ["Bug Fix", "bugfix", "BUG-FIX", "bug  fix", " Bug_Fix ", "Bug - Fix", "bug_fix"],
    ids=["title-case", "one-word", "hyphen", "two-spaces", "padded", "spaced-hyphen", "as-named"],
)
def test_a_category_spelt_otherwise_is_the_catalogue_s(said: str) -> None:
    assert parse_classification_reply(reply(said), None).category == "bug_fix"


def test_every_category_of_the_catalogue_is_read_in_words() -> None:
    for category in CATEGORIES:
        words = category.replace("_", " ").title()
        assert parse_classification_reply(reply(words), None).category == category


def test_a_complexity_is_read_the_same_way() -> None:
    assert parse_classification_reply(reply("feature", " High "), None).complexity == "high"


@pytest.mark.parametrize(
    "said",
    ["Feature Request", "bug fixes", "bug_fix_2", "poetry"],
    ids=["more-words", "plural", "digit", "unknown"],
)
def test_a_name_the_catalogue_does_not_have_is_still_refused_quoting_the_model(said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_classification_reply(reply(said), None)
    assert str(refused.value).endswith(f"got {said!r}")


async def test_the_engine_classifies_a_task_the_model_calls_a_bug_fix_in_words(engine: Engine) -> None:
    # Given a model that answers "Bug Fix"
    engine.llm = llm = ScriptedLlm(reply("Bug Fix", "High"), usage=USAGE)
    engine.create_task("t1", "Fix the race in the Go worker", [])

    # When the task is classified
    task = await engine.classify_task("t1")

    # Then one call classified it, its category the catalogue's: nothing failed, no fallback
    assert len(llm.calls) == 1
    assert task.classification is not None
    assert (task.classification.category, task.classification.complexity) == ("bug_fix", "high")
    assert task.classification_failure is None
    assert task.status is TaskStatus.PENDING
    assert [e.event_type for e in engine.task_history("t1")] == ["Task.Created", "Task.Classified"]
