"""Classifying tasks through the LLM port, on both backends: the engine's decisions, with the one
LLM double (tests/support/llm.py); the real client against the simulator is in
tests/integration/test_llm_task_classification.py and tests/e2e/test_http_tasks.py."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from flowledger.domain.errors import LlmCallFailed, LlmNotConfigured, ValidationError
from flowledger.domain.task import task_uuid
from flowledger.domain.task_views import Classification, TaskStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections.calls import call_of
from tests.support.llm import ScriptedLlm

USAGE = LlmUsage(
    provider="fake",
    request_model="deepseek-v3.2",
    input_tokens=120,
    output_tokens=30,
    cost_usd=Decimal("0.0000210"),
    latency_ms=41.0,
)


def answer(**fields: Any) -> str:
    return json.dumps(fields)


async def test_a_classification_is_recorded_with_the_usage_that_produced_it(engine: Engine) -> None:
    # Given a task and a model that calls it a feature
    engine.llm = llm = ScriptedLlm(
        answer(category="feature", complexity="high", estimated_hours=6), usage=USAGE
    )
    engine.create_task("t1", "Add OAuth login", ["python"])

    # When it is classified
    task = await engine.classify_task("t1", model="deepseek-v3.2")

    # Then the classification and its usage are on the task and in its history
    assert task.classification == Classification(
        category="feature", complexity="high", estimated_hours=6.0, usage=USAGE
    )
    classified = engine.task_history("t1")[-1]
    assert classified.event_type == "Task.Classified"
    assert classified.data["usage"] == USAGE
    assert llm.calls[0].model == "deepseek-v3.2"
    assert "Add OAuth login" in llm.calls[0].messages[-1]["content"]


async def test_a_classified_task_is_not_sent_to_the_model_again(engine: Engine) -> None:
    llm = ScriptedLlm(answer(category="bug_fix", complexity="low", estimated_duration_hours=1), usage=USAGE)
    engine.llm = llm
    engine.create_task("t1", "Typo on the home page", [])
    first = await engine.classify_task("t1")
    assert await engine.classify_task("t1") == first
    assert len(llm.calls) == 1


async def test_an_unusable_reply_is_retried_on_the_fallback_then_leaves_the_task_waiting(
    engine: Engine,
) -> None:
    # Given a model that answers with a category that does not exist
    llm = ScriptedLlm(answer(category="poetry", complexity="low", estimated_hours=1), usage=USAGE)
    engine.llm = llm
    engine.create_task("t1", "Write a haiku", [], priority="low")

    # When the task is classified
    task = await engine.classify_task("t1")

    # Then the low tier's model was tried, then the routing's fallback, and both failures
    # are recorded with their usage; the task still waits, unclassified and not escalated
    assert [call.model for call in llm.calls] == ["gemini-2.5-flash", "deepseek-v3.2"]
    assert task.status is TaskStatus.PENDING
    assert task.classification is None
    assert task.escalation is None
    failed = [e for e in engine.task_history("t1") if e.event_type == "Task.ClassificationFailed"]
    assert [(e.data["model"], e.data["fallback"]) for e in failed] == [
        ("gemini-2.5-flash", "deepseek-v3.2"),
        ("deepseek-v3.2", None),
    ]
    assert all(e.data["usage"] == USAGE and "poetry" in e.data["detail"] for e in failed)


async def test_a_failed_model_call_leaves_an_assigned_task_with_its_agent(engine: Engine) -> None:
    # Given a task already assigned, and a model that keeps failing
    engine.register_agent("be", "Backend", ["python"], 1)
    engine.create_task("t1", "Fix the API", ["python"])
    engine.assign_task("t1")
    engine.llm = ScriptedLlm(
        usage=USAGE,
        error=LlmCallFailed(
            "503 three times", error_type="http_503", attempts=3, usage=USAGE, status_code=503
        ),
    )

    # When it is classified
    task = await engine.classify_task("t1")

    # Then the failures are recorded with what they spent, and nothing else changed
    assert task.status is TaskStatus.ASSIGNED
    assert engine.get_agent("be").load == 1
    events = list(engine.log.stream(task_uuid(engine.tenant, "t1")))
    calls = [call for call in map(call_of, events) if call is not None]
    assert [(c.error_type, c.usage) for c in calls] == [("classification_failed", USAGE)] * 2


async def test_a_failure_of_a_task_closed_during_the_call_names_no_fallback_and_tries_none(
    engine: Engine,
) -> None:
    # Given an assigned task, and a model that fails while the task is completed meanwhile
    engine.register_agent("be", "Backend", ["python"], 1)
    engine.create_task("t1", "Fix the API", ["python"])
    engine.assign_task("t1")
    failure = LlmCallFailed("503", error_type="http_503", attempts=1, usage=USAGE, status_code=503)
    engine.llm = llm = ScriptedLlm(usage=USAGE, error=failure, meanwhile=lambda: engine.complete_task("t1"))
    # When it is classified
    task = await engine.classify_task("t1")
    # Then the failure is kept with its cost, no fallback is named, and none is called
    assert task.status is TaskStatus.COMPLETED
    assert len(llm.calls) == 1
    last = engine.task_history("t1")[-1]
    assert last.event_type.endswith("ClassificationFailed")
    assert last.data["fallback"] is None


async def test_a_waiting_task_can_be_classified_again_after_a_failure(engine: Engine) -> None:
    # Given a task whose classification failed on every model
    engine.llm = ScriptedLlm(answer(category="poetry", complexity="low", estimated_hours=1), usage=USAGE)
    engine.create_task("t1", "Fix the login page", [])
    await engine.classify_task("t1")

    # When the model answers sensibly and the task is reclassified
    engine.llm = ScriptedLlm(answer(category="bug_fix", complexity="medium", estimated_hours=2), usage=USAGE)
    task = await engine.reclassify_task("t1")

    # Then it is classified, and reclassifying it again replaces the classification
    assert task.classification is not None
    assert task.classification.category == "bug_fix"
    engine.llm = ScriptedLlm(answer(category="feature", complexity="low", estimated_hours=1), usage=USAGE)
    again = await engine.reclassify_task("t1")
    assert again.classification is not None
    assert again.classification.category == "feature"


async def test_a_reclassification_that_raises_no_priority_gives_back_the_creators(engine: Engine) -> None:
    # Given a low-priority task that a critical classification raised to critical
    engine.llm = ScriptedLlm(
        answer(category="bug_fix", complexity="critical", estimated_hours=2), usage=USAGE
    )
    engine.create_task("t1", "Fix the login page", [], priority="low")
    assert (await engine.classify_task("t1")).priority.value == "critical"
    # When it is reclassified as low complexity (which raises nothing)
    engine.llm = ScriptedLlm(
        answer(category="documentation", complexity="low", estimated_hours=1), usage=USAGE
    )
    again = await engine.reclassify_task("t1")
    # Then its priority is the creator's again, and the classification says why
    assert again.priority.value == "low"
    assert "priority back to low as created" in engine.task_history("t1")[-1].data["derivation"]
    # And a reclassification that raises it again raises it
    engine.llm = ScriptedLlm(answer(category="bug_fix", complexity="high", estimated_hours=2), usage=USAGE)
    assert (await engine.reclassify_task("t1")).priority.value == "high"


async def test_classifying_without_an_llm_adapter_says_so(engine: Engine) -> None:
    engine.llm = None
    engine.create_task("t1", "Anything", [])
    with pytest.raises(LlmNotConfigured, match=r"built without an LLM adapter"):
        await engine.classify_task("t1")


def test_a_classification_made_elsewhere_is_recorded_without_usage(engine: Engine) -> None:
    engine.create_task("t1", "Deploy", ["terraform"])
    task = engine.record_classification("t1", "deployment", "medium", 2.5)
    assert task.classification == Classification(
        category="deployment", complexity="medium", estimated_hours=2.5
    )
    with pytest.raises(ValidationError, match=r"estimated_hours: must be above 0, got 0"):
        engine.record_classification("t1", "deployment", "medium", 0)
    with pytest.raises(ValidationError, match=r"estimated_hours: must be at most 10000, got 10000.5"):
        engine.record_classification("t1", "deployment", "medium", 10_000.5)
    with pytest.raises(ValidationError, match=r"estimated_hours: must be a number, got nan"):
        engine.record_classification("t1", "deployment", "medium", float("nan"))


def test_a_reply_is_parsed_even_when_wrapped_in_prose() -> None:
    parsed = Classification.from_reply(
        'Sure! ```json\n{"category": "Review", "complexity": "LOW", "estimated_hours": 0.5}\n```',
        None,
    )
    assert (parsed.category, parsed.complexity, parsed.estimated_hours) == ("review", "low", 0.5)
    with pytest.raises(ValidationError, match=r"classification: no JSON object in 'no json here'"):
        Classification.from_reply("no json here", None)


def test_a_reply_nested_past_the_parser_is_an_invalid_classification() -> None:
    # RecursionError escaped the parser, past the router's handling of an unusable answer
    with pytest.raises(ValidationError, match="classification: invalid JSON: nested too deep"):
        Classification.from_reply('{"category": ' * 50_000 + "}", None)


async def test_a_classification_that_lost_the_race_keeps_its_cost_on_the_task(engine: Engine) -> None:
    # Given a task that the caller classifies while the model is still answering
    engine.create_task("t9", "Review the PR", ["python"])
    engine.llm = ScriptedLlm(
        answer(category="feature", complexity="high", estimated_hours=6),
        usage=USAGE,
        meanwhile=lambda: engine.record_classification("t9", "review", "low", 1.0),
    )

    # When the model's answer arrives
    task = await engine.classify_task("t9")

    # Then the caller's classification stands, and the call's usage is recorded anyway
    assert task.classification is not None
    assert task.classification.category == "review"
    last = engine.task_history("t9")[-1]
    assert last.event_type == "Task.ClassificationDiscarded"
    assert last.data["usage"] == USAGE
    assert last.data["reason"] == "task already classified (by another call while this one ran)"
    events = list(engine.log.stream(task_uuid(engine.tenant, "t9")))
    calls = [call for call in map(call_of, events) if call is not None]
    assert [call.usage for call in calls] == [USAGE]


def test_a_classification_made_elsewhere_takes_its_category_and_complexity_in_any_case(
    engine: Engine,
) -> None:
    # (as priorities and statuses are; "Bug_Fix" and "HIGH" were refused)
    engine.create_task("t1", "Fix", ["python"])
    task = engine.record_classification("t1", "Bug_Fix", "HIGH", 3)
    assert task.classification == Classification(category="bug_fix", complexity="high", estimated_hours=3)
    with pytest.raises(ValidationError, match=r"category: must be one of .* \(any case\), got 'bugfix'"):
        engine.record_classification("t1", "bugfix", "high", 3)
    with pytest.raises(ValidationError, match="complexity"):
        engine.record_classification("t1", "bug_fix", 3, 3)  # type: ignore[arg-type]


NESTED_PAST_THE_PARSER = '{"category": "bug_fix", "complexity": "low", "estimated_hours": 1, "x": ' + (
    "[" * 1100 + "]" * 1100 + "}"
)
"""A reply of 2 KB whose arrays nest deeper than ``json.loads`` can follow (RecursionError)."""


async def test_a_reply_nested_past_the_parser_is_a_failed_classification_not_a_crash(engine: Engine) -> None:
    # Given a model whose reply nests 1,100 arrays deep (json.loads raises RecursionError)
    llm = ScriptedLlm(NESTED_PAST_THE_PARSER, usage=USAGE)
    engine.llm = llm
    engine.create_task("t1", "Fix the race in the Go worker", [], priority="low")

    # When the task is classified
    task = await engine.classify_task("t1")

    # Then it is an unusable reply like any other: the fallback was tried, both paid calls are
    # recorded as failures, and the task waits (it raised RecursionError, HTTP 500, nothing recorded)
    assert [call.model for call in llm.calls] == ["gemini-2.5-flash", "deepseek-v3.2"]
    assert task.status is TaskStatus.PENDING
    failed = [e for e in engine.task_history("t1") if e.event_type == "Task.ClassificationFailed"]
    assert len(failed) == 2
    assert all(e.data["usage"] == USAGE and "nested" in e.data["detail"] for e in failed)
