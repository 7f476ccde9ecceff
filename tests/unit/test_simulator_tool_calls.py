"""A request that makes the model call a tool (``tool_choice`` ``required`` or naming a
function) is answered with a tool call, as OpenAI answers it, read by the official SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.support.simulator_sdk import sdk_on_simulator

MESSAGES: list[Any] = [{"role": "user", "content": '{"message": "where is my order A1001?"}'}]


class GetOrder(BaseModel):
    order_id: str
    include_tracking: bool


class Escalate(BaseModel):
    reason: str
    priority: int


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with sdk_on_simulator() as sdk:
        yield sdk


def test_tool_choice_required_is_answered_with_a_call_the_sdk_parses(client: openai.OpenAI) -> None:
    # When
    completion = client.chat.completions.parse(
        model="gpt-4.1",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetOrder)],
        tool_choice="required",
    )
    # Then
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "GetOrder"
    assert isinstance(call.function.parsed_arguments, GetOrder)
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens >= len(call.function.arguments) // 4
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    # When
    completion = client.chat.completions.parse(
        model="gpt-4.1",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetOrder), openai.pydantic_function_tool(Escalate)],
        tool_choice={"type": "function", "function": {"name": "Escalate"}},
    )
    # Then: OpenAI ends a call it was told to make with "stop"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    calls = choice.message.tool_calls or []
    assert [call.function.name for call in calls] == ["Escalate"]
    assert isinstance(calls[0].function.parsed_arguments, Escalate)


def test_a_streamed_tool_call_is_put_together_by_the_sdk_with_its_usage(client: openai.OpenAI) -> None:
    # When
    with client.chat.completions.stream(
        model="gpt-4.1",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetOrder)],
        tool_choice="required",
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
    # Then
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert isinstance(calls[0].function.parsed_arguments, GetOrder)
    assert json.loads(calls[0].function.arguments) == calls[0].function.parsed_arguments.model_dump()
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0


def test_n_choices_each_carry_the_call(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="gpt-4.1",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetOrder)],
        tool_choice="required",
        n=2,
    )
    assert [len(choice.message.tool_calls or []) for choice in completion.choices] == [1, 1]


def test_tool_choice_auto_or_none_is_answered_with_text(client: openai.OpenAI) -> None:
    for choice in ("auto", "none"):
        completion = client.chat.completions.create(
            model="gpt-4.1",
            messages=MESSAGES,
            tools=[openai.pydantic_function_tool(GetOrder)],
            tool_choice=choice,
        )
        assert completion.choices[0].message.tool_calls is None
        assert completion.choices[0].message.content


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        # "auto" without tools was answered 200: OpenAI refuses it as it refuses "required"
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "GetOrder"}}}, "tool_choice"),
        (
            {
                "tools": [openai.pydantic_function_tool(GetOrder)],
                "tool_choice": {"type": "function", "function": {"name": "Refund"}},
            },
            "tool_choice",
        ),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
    ],
)
def test_a_tool_choice_that_names_no_tool_given_is_refused_as_openai_refuses_it(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, **fields)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == param


LEGACY_FUNCTIONS: list[Any] = [
    {"name": "get_order", "parameters": GetOrder.model_json_schema()},
    {"name": "escalate", "parameters": Escalate.model_json_schema()},
]


def test_a_legacy_forced_function_call_is_answered_with_that_call(client: openai.OpenAI) -> None:
    # When a request names the function to call the legacy way (functions, function_call):
    # the simulator answered it with its text reply, no function_call
    completion = client.chat.completions.create(
        model="gpt-4.1",
        messages=MESSAGES,
        functions=LEGACY_FUNCTIONS,
        function_call={"name": "escalate"},
    )
    # Then the message is that call, as the SDK reads it, and no tool call
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # as OpenAI ends a call it was told to make
    assert choice.message.content is None
    assert choice.message.tool_calls is None
    call = choice.message.function_call
    assert call is not None
    assert call.name == "escalate"
    assert Escalate.model_validate_json(call.arguments)


def test_a_streamed_legacy_function_call_is_put_together_by_the_sdk(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="gpt-4.1", messages=MESSAGES, functions=LEGACY_FUNCTIONS, function_call={"name": "get_order"}
    ) as stream:
        chunks = list(stream)
        completion = stream.get_final_completion()
    call = completion.choices[0].message.function_call
    assert call is not None
    assert call.name == "get_order"
    assert GetOrder.model_validate_json(call.arguments)
    assert len([c for c in chunks if c.type == "chunk"]) > 2  # the arguments come in pieces


def test_legacy_function_call_auto_or_none_is_answered_with_text(client: openai.OpenAI) -> None:
    for choice in ("auto", "none"):
        completion = client.chat.completions.create(
            model="gpt-4.1", messages=MESSAGES, functions=LEGACY_FUNCTIONS, function_call=choice
        )
        message = completion.choices[0].message
        assert (message.function_call, message.tool_calls) == (None, None)
        assert message.content


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"function_call": {"name": "get_order"}}, "function_call"),
        ({"functions": LEGACY_FUNCTIONS, "function_call": {"name": "refund"}}, "function_call"),
        ({"functions": LEGACY_FUNCTIONS, "function_call": "required"}, "function_call"),
        ({"functions": [{"parameters": {}}], "function_call": "auto"}, "functions[0].name"),
        ({"functions": "get_order"}, "functions"),
    ],
)
def test_a_legacy_function_call_that_names_no_function_given_is_refused(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, **fields)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == param


def function_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": []}, "tools", "empty_array"),
        ({"tools": [function_tool("get.order")]}, "tools[0].function.name", "invalid_value"),
        ({"tools": [function_tool("get order")]}, "tools[0].function.name", "invalid_value"),
        (
            {"tools": [function_tool("f"), function_tool("a" * 65)]},
            "tools[1].function.name",
            "string_above_max_length",
        ),
        ({"tools": [function_tool("")]}, "tools[0].function.name", "empty_string"),
        ({"functions": [{"name": "get order"}]}, "functions[0].name", "invalid_value"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls", None),
    ],
    ids=["no-tools", "dot", "space", "65-chars", "empty-name", "legacy-space", "parallel-without-tools"],
)
def test_tools_openai_refuses_are_refused_here(
    client: openai.OpenAI, fields: dict[str, Any], param: str, code: str | None
) -> None:
    # Each was answered 200 with text: an agent whose tool was named "get.order" (or that sent
    # parallel_tool_calls on a turn without tools) passed here and was refused by OpenAI.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, **fields)
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["param"], refused.value.body["code"]) == (param, code)


def test_function_names_of_up_to_64_letters_digits_underscores_and_dashes_are_taken(
    client: openai.OpenAI,
) -> None:
    name = "Get_order-2" + "x" * 53
    completion = client.chat.completions.create(
        model="gpt-4.1",
        messages=MESSAGES,
        tools=[function_tool(name)],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [call.function.name for call in calls] == [name]
