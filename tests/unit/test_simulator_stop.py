"""``stop`` ends the reply before the first of its sequences, as OpenAI's does, read by the
official SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from flowledger.adapters.simulator.replies import count_tokens
from tests.support.simulator_sdk import sdk_on_simulator

MESSAGES: list[Any] = [{"role": "user", "content": '{"message": "hello"}'}]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with sdk_on_simulator() as sdk:
        yield sdk


def whole_reply(client: openai.OpenAI) -> str:
    completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    return completion.choices[0].message.content or ""


@pytest.mark.parametrize("stop", ["next_step", ["zzz", "next_step", '"message"']])
def test_the_reply_ends_before_the_first_stop_sequence_it_holds(client: openai.OpenAI, stop: Any) -> None:
    # Given
    whole = whole_reply(client)
    first = min(whole.index(s) for s in ([stop] if isinstance(stop, str) else stop) if s in whole)
    # When
    completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stop=stop)
    # Then: cut there, the sequence left out, ended with stop, and counted as sent
    choice = completion.choices[0]
    assert choice.message.content == whole[:first]
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == count_tokens(whole[:first])


def test_a_streamed_reply_stops_there_too(client: openai.OpenAI) -> None:
    whole = whole_reply(client)
    stream = client.chat.completions.create(
        model="gpt-4.1",
        messages=MESSAGES,
        stop="next_step",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole[: whole.index("next_step")]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == count_tokens(text)


def test_a_stop_sequence_the_reply_does_not_hold_changes_nothing(client: openai.OpenAI) -> None:
    whole = whole_reply(client)
    completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stop=["\u2603"])
    assert completion.choices[0].message.content == whole
    assert json.loads(whole)
