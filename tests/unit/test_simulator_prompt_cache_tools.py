"""The simulator's prompt cache covers the tools a request offers, as OpenAI's does: the tool
definitions come before the messages in the cached prefix. The simulator hashed the messages
alone: a request whose long tool list was the same as the last one's, with a short message,
was reported with nothing cached, and the same long messages with other tools as cached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.simulator_sdk import sdk_on_simulator

SHORT: list[Any] = [{"role": "user", "content": "where is my order A1001?"}]
LONG: list[Any] = [{"role": "system", "content": "You are a careful support agent. " * 130}, *SHORT]


def tools(prefix: str, count: int = 12) -> list[Any]:
    """``count`` function tools, about 1,500 prompt tokens in all."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"{prefix}_{n}",
                "description": f"Looks up the {prefix} record number {n} in the order system. " * 6,
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
            },
        }
        for n in range(count)
    ]


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    with sdk_on_simulator() as sdk:
        yield sdk


def cached(client: openai.OpenAI, messages: list[Any], offered: list[Any] | None) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of a call of gpt-4.1 with ``messages`` and ``offered`` tools."""
    options: dict[str, Any] = {} if offered is None else {"tools": offered}
    usage = client.chat.completions.create(model="gpt-4.1", messages=messages, **options).usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def test_a_long_tool_list_sent_again_is_reported_cached(client: openai.OpenAI) -> None:
    # Given a call with a long list of tools and a short message
    prompt, first = cached(client, SHORT, tools("order"))
    assert prompt >= 1_024
    assert first == 0
    # When the same tools come again with the same message
    _, again = cached(client, SHORT, tools("order"))
    # Then the tools and the message are the cached prefix, in 128-token steps
    assert again >= 1_024
    assert again % 128 == 0
    assert again <= prompt


def test_long_messages_with_other_tools_are_not_cached(client: openai.OpenAI) -> None:
    # Given long messages sent with one list of tools
    cached(client, LONG, tools("order", count=2))
    # When they come with another list of tools
    _, other = cached(client, LONG, tools("refund", count=2))
    # Then nothing is cached: the prefix differs from its start, at the tools
    assert other == 0
    # And with the first tools again, the whole prefix is
    _, same = cached(client, LONG, tools("order", count=2))
    assert same >= 1_024


def test_long_messages_first_sent_without_tools_are_not_cached_with_tools(client: openai.OpenAI) -> None:
    cached(client, LONG, None)
    _, with_tools = cached(client, LONG, tools("order", count=2))
    assert with_tools == 0
    _, without = cached(client, LONG, None)
    assert without >= 1_024
