"""Messages that cannot be sent as JSON are refused by the client before anything is sent, as a
ValidationError on ``messages``: they escaped as the encoder's own errors (``ValueError: Out of
range float values are not JSON compliant``, ``TypeError: Object of type datetime is not JSON
serializable``, ``UnicodeEncodeError`` for a lone surrogate, ``RecursionError``), after the
model's rate limit had been taken and the breaker asked. The engine's steps check their input
first; a caller of the client (the LLM port) did not."""

from __future__ import annotations

import datetime
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.config import ModelLimits
from flowledger.domain import ValidationError

OK = {
    "id": "c-1",
    "model": "gpt-4.1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}


def nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


UNSENDABLE = {
    "nan": {"role": "user", "content": "json", "weight": float("nan")},
    "datetime": {"role": "user", "content": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)},
    "set": {"role": "user", "content": {"a"}},
    "bytes": {"role": "user", "content": b"json"},
    "lone-surrogate": {"role": "user", "content": "json \ud800"},
    "nested-past-the-encoder": {"role": "user", "content": nested(5_000)},
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("message", list(UNSENDABLE.values()), ids=list(UNSENDABLE))
async def test_messages_that_cannot_be_sent_as_json_are_refused_before_anything_is_sent(
    message: dict[str, Any], stream: bool
) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=OK)

    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-unsendable"),
        default_model="gpt-4.1",
        stream=stream,
        limits={"gpt-4.1": ModelLimits(rpm=1, tpm=100_000)},
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(answer))
    # When a call's messages cannot be written as JSON
    with pytest.raises(ValidationError) as refused:
        await llm.complete(model=None, messages=[message])
    # Then it is refused on its messages, saying why, and nothing was sent
    assert refused.value.field == "messages"
    assert "JSON" in refused.value.message
    assert sent == []
    # And the model's one request a minute is still there for a call that can be sent
    reply = await llm.complete(model=None, messages=[{"role": "user", "content": "json"}])
    assert reply.content == "{}"
    assert len(sent) == 1
    await llm.aclose()
