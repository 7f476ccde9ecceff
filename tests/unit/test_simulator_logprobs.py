"""``logprobs: true`` is answered with a log probability for each token of the reply (and
``top_logprobs`` alternatives), as OpenAI answers it, read by the official SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.simulator_sdk import sdk_on_simulator

MESSAGES: list[Any] = [{"role": "user", "content": '{"message": "where is my order A1001?"}'}]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with sdk_on_simulator() as sdk:
        yield sdk


def test_each_token_of_the_reply_has_its_log_probability_and_the_top_alternatives(
    client: openai.OpenAI,
) -> None:
    # When
    completion = client.chat.completions.create(
        model="gpt-4.1", messages=MESSAGES, logprobs=True, top_logprobs=3
    )
    # Then
    choice = completion.choices[0]
    assert choice.logprobs is not None
    tokens = choice.logprobs.content or []
    assert "".join(token.token for token in tokens) == choice.message.content
    assert completion.usage is not None
    assert len(tokens) == completion.usage.completion_tokens  # 4 characters a token, as it counts them
    for token in tokens:
        assert token.logprob <= 0
        assert token.bytes == list(token.token.encode())
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token
        assert token.top_logprobs[0].logprob == token.logprob
        assert [alt.logprob for alt in token.top_logprobs] == sorted(
            (alt.logprob for alt in token.top_logprobs), reverse=True
        )


def test_without_top_logprobs_each_token_has_none(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, logprobs=True, n=2)
    for choice in completion.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.content
        assert all(token.top_logprobs == [] for token in choice.logprobs.content)


def test_a_streamed_reply_carries_the_log_probabilities_of_each_delta(client: openai.OpenAI) -> None:
    # When
    stream = client.chat.completions.create(
        model="gpt-4.1", messages=MESSAGES, logprobs=True, top_logprobs=1, stream=True
    )
    # Then: every content delta's tokens are that delta's text
    text, tokens = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                assert choice.logprobs is not None
                pieces = [token.token for token in choice.logprobs.content or []]
                assert "".join(pieces) == choice.delta.content
                text += choice.delta.content
                tokens += "".join(pieces)
    assert text
    assert tokens == text


def test_without_logprobs_there_are_none(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, logprobs=False)
    assert completion.choices[0].logprobs is None
