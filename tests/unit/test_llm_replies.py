"""Reading a model's step decision: JSON when it is JSON, a flagged message when it is not."""

from __future__ import annotations

import json

import pytest

from flowledger.domain.ports import parse_step_reply, step_messages


def test_a_json_reply_gives_action_context_update_next_step_and_message() -> None:
    reply = parse_step_reply(
        json.dumps(
            {
                "action": "classify",
                "context_update": {"intent": "refund"},
                "next_step": "resolve",
                "message": "Refund, got it.",
            }
        )
    )
    assert reply.structured
    assert (reply.action, reply.next_step, reply.message) == ("classify", "resolve", "Refund, got it.")
    assert reply.context_update == {"intent": "refund"}
    assert reply.output() == {
        "action": "classify",
        "message": "Refund, got it.",
        "reply_format": "json",
        "problems": [],
    }


def test_json_in_a_markdown_fence_is_still_json() -> None:
    reply = parse_step_reply('```json\n{"action": "greet", "message": "hi"}\n```')
    assert reply.structured
    assert reply.action == "greet"


@pytest.mark.parametrize("content", ["Sure! I can help.", "[1, 2, 3]", '"just a string"', "{broken", ""])
def test_a_reply_that_is_not_a_json_object_falls_back_to_a_flagged_message(content: str) -> None:
    reply = parse_step_reply(content)
    assert not reply.structured
    assert reply.message == content
    assert (reply.action, reply.next_step, reply.context_update) == (None, None, None)
    assert reply.output()["reply_format"] == "text"


def test_unusable_fields_are_dropped_and_listed() -> None:
    reply = parse_step_reply(
        json.dumps({"action": 7, "context_update": ["no"], "next_step": "x" * 300, "message": "ok"})
    )
    assert reply.structured
    assert (reply.action, reply.context_update, reply.next_step) == (None, None, None)
    assert reply.message == "ok"
    assert len(reply.problems) == 3


def test_a_context_update_with_nan_is_dropped_because_events_must_hold_plain_json() -> None:
    reply = parse_step_reply('{"context_update": {"score": NaN}, "message": "m"}')
    assert reply.context_update is None
    assert reply.problems == ("context_update is not a plain JSON object",)


def test_the_step_prompt_names_the_step_and_carries_context_and_input() -> None:
    messages = step_messages(
        step="resolve", previous_step="classify_intent", context={"intent": "refund"}, input={"order": 12}
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "Current step: resolve" in messages[0]["content"]
    assert "Previous step: classify_intent" in messages[0]["content"]
    assert json.loads(messages[1]["content"]) == {"intent": "refund", "order": 12}
