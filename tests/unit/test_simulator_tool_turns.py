"""A conversation that calls tools is checked as OpenAI checks it: every call an assistant
made is answered by a tool message naming it, and a tool message answers a call. The
official SDK makes the round trip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.support.simulator_sdk import sdk_on_simulator

ASKED: dict[str, Any] = {"role": "user", "content": "where is my order A1001?"}
CALLED: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "GetOrder", "arguments": '{"order_id": "A1001"}'},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "GetOrder", "arguments": '{"order_id": "B2"}'},
        },
    ],
}


def answer(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": '{"status": "shipped"}'}


class GetOrder(BaseModel):
    order_id: str


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with sdk_on_simulator() as sdk:
        yield sdk


def test_a_call_the_simulator_made_answered_by_its_result_is_answered_with_text(
    client: openai.OpenAI,
) -> None:
    # Given: the model calls a tool
    tools = [openai.pydantic_function_tool(GetOrder)]
    first = client.chat.completions.create(
        model="gpt-4.1", messages=[ASKED], tools=tools, tool_choice="required"
    )
    message = first.choices[0].message
    calls = message.tool_calls or []
    # When: its result goes back, as an agent loop sends it
    second = client.chat.completions.create(
        model="gpt-4.1",
        messages=[ASKED, message.model_dump(exclude_none=True), answer(calls[0].id)],
        tools=tools,
    )
    # Then
    assert second.choices[0].message.content
    assert second.choices[0].message.tool_calls is None


def test_every_call_answered_in_any_order_is_taken(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="gpt-4.1", messages=[ASKED, CALLED, answer("call_2"), answer("call_1")]
    )
    assert completion.choices[0].message.content


@pytest.mark.parametrize(
    ("messages", "message", "param"),
    [
        (
            [ASKED, CALLED, answer("call_1")],
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
            " 'tool_call_id'. The following tool_call_ids did not have response messages: call_2",
            "messages.[1].role",
        ),
        (
            [ASKED, CALLED, answer("call_1"), {"role": "user", "content": "and?"}, answer("call_2")],
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
            " 'tool_call_id'. The following tool_call_ids did not have response messages: call_2",
            "messages.[1].role",
        ),
        (
            [ASKED, answer("call_1")],
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with"
            " 'tool_calls'.",
            "messages.[1].role",
        ),
        (
            [ASKED, CALLED, answer("call_1"), answer("call_9")],
            "Invalid parameter: 'tool_call_id' of 'call_9' not found in 'tool_calls' of previous message.",
            "messages.[3].tool_call_id",
        ),
    ],
    ids=["a-call-unanswered", "answered-too-late", "a-result-without-a-call", "a-result-for-another-call"],
)
def test_a_conversation_whose_calls_and_results_do_not_match_is_refused_as_openai_refuses_it(
    client: openai.OpenAI, messages: list[Any], message: str, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4.1", messages=messages)
    assert refused.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
