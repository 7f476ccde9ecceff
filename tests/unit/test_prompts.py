"""The one prompts module: what each conversation asks, how replies are read, and who else relies on it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from flowledger.adapters.simulator.replies import step_decision
from flowledger.domain import ports, prompts
from flowledger.domain.errors import ValidationError
from flowledger.domain.task_views import CATEGORIES, COMPLEXITIES


@dataclass
class _Task:
    description: str
    required_skills: list[str] = field(default_factory=list)


def test_the_classification_prompt_asks_for_one_json_object_with_the_domain_vocabularies() -> None:
    messages = prompts.classification_messages(_Task("Fix the race in checkout", ["python", "sql"]))
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == prompts.CLASSIFICATION_SYSTEM_PROMPT
    assert all(name in messages[0]["content"] for name in (*CATEGORIES, *COMPLEXITIES))
    assert (
        messages[1]["content"] == "Classify this task: Fix the race in checkout\nRequired skills: python, sql"
    )


def test_a_task_without_skills_says_none_listed() -> None:
    [_, user] = prompts.classification_messages(_Task("Write the runbook"))
    assert user["content"].endswith("Required skills: none listed")


def test_a_classification_reply_is_read_into_a_classification_with_its_usage() -> None:
    reply = 'Sure: {"category": "Bug_Fix", "complexity": "high", "estimated_hours": 12}'
    classification = prompts.parse_classification_reply(reply, None)
    assert (classification.category, classification.complexity, classification.estimated_hours) == (
        "bug_fix",
        "high",
        12.0,
    )


def test_an_unusable_classification_reply_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match=r"classification: no JSON object in 'I think it is a bug'"):
        prompts.parse_classification_reply("I think it is a bug", None)


def test_the_step_names_stay_importable_from_the_port() -> None:
    assert ports.parse_step_reply is prompts.parse_step_reply
    assert ports.step_messages is prompts.step_messages
    assert ports.StepReply is prompts.StepReply
    assert ports.STEP_REPLY_KEYS == prompts.STEP_REPLY_KEYS


def test_the_simulator_recognises_both_conversations_by_the_prompts_own_text() -> None:
    # Given the messages the engine sends for a task and for a step
    classify = prompts.classification_messages(_Task("Deploy the helm chart"))
    step = prompts.step_messages(step="greet", previous_step="init", context={}, input={"message": "hi"})
    # Then the simulator answers each in its own shape, and the parsers accept the answers
    classification = prompts.parse_classification_reply(json.dumps(step_decision(classify)), None)
    assert classification.category == "deployment"
    decision = prompts.parse_step_reply(json.dumps(step_decision(step)))
    assert (decision.action, decision.next_step, decision.structured) == ("greet", "classify_intent", True)


NESTED = "[" * 1100 + "]" * 1100
"""Arrays nested deeper than ``json.loads`` can follow: it raises RecursionError, not ValueError."""


def test_a_classification_reply_nested_past_the_parser_is_a_validation_error() -> None:
    reply = '{"category": "bug_fix", "complexity": "low", "estimated_hours": 1, "x": ' + NESTED + "}"
    with pytest.raises(ValidationError, match=r"classification: .*nested"):
        prompts.parse_classification_reply(reply, None)


def test_a_ranking_reply_nested_past_the_parser_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match=r"ranking: the reply is not one JSON object"):
        prompts.parse_ranking_reply('{"agent_id": "be-1", "x": ' + NESTED + "}", ["be-1"])


def test_a_step_reply_nested_past_the_parser_is_a_plain_message() -> None:
    content = '{"action": "reply", "x": ' + NESTED + "}"
    reply = prompts.parse_step_reply(content)
    assert (reply.structured, reply.message, reply.action) == (False, content, None)


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ('{"category": "bug_fix", "complexity": "low", "estimated_hours": "3"}', r"estimated_hours: .*'3'"),
        ('{"category": "bug_fix", "complexity": "high"}', r"estimated_hours: .*got None"),
        ('{"category": null, "complexity": "high", "estimated_hours": 3}', r"category: .*got None"),
        ('{"category": "bug_fix", "estimated_hours": 3}', r"complexity: .*got None"),
    ],
)
def test_a_refused_classification_reply_quotes_what_the_model_said(reply: str, said: str) -> None:
    # The failure is recorded (ClassificationFailed.detail) and shown: it said "got -1.0" for
    # hours given as text or left out, and "got 'none'" for a category given as null
    with pytest.raises(ValidationError, match=said):
        prompts.parse_classification_reply(reply, None)
