"""A stream (SSE ``data:`` lines) under another label than ``text/event-stream`` is read as the
stream it is: a proxy that streams whatever it is asked, labelling it ``application/json`` (or
not at all), sent a paid answer that failed as "reply body is not JSON", not retried."""

from __future__ import annotations

import json

import httpx
import pytest

from flowledger.adapters.llm import OpenAICompatibleClient
from flowledger.domain.errors import LlmCallFailed
from tests.support.mock_endpoint import mock_client

MESSAGES = [{"role": "user", "content": "hello"}]
CHUNKS = [
    {"id": "c-1", "model": "gpt-4.1", "choices": [{"delta": {"content": '{"action": '}}]},
    {"id": "c-1", "choices": [{"delta": {"content": '"x"}'}, "finish_reason": "stop"}]},
    {"id": "c-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
]
STREAM = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in CHUNKS) + "data: [DONE]\n\n"
WRITTEN = {
    "plain": STREAM,
    "a comment first": ": keep-alive\n\n" + STREAM,
    "an event name first": "event: message\n" + STREAM,
    "a byte-order mark and a blank line first": "\ufeff\n" + STREAM,
    "CRLF lines": STREAM.replace("\n", "\r\n"),
}


def client_for(body: bytes, content_type: str | None, seen: list[httpx.Request]) -> OpenAICompatibleClient:
    """A client whose endpoint answers every request 200 ``body`` labelled ``content_type``."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {} if content_type is None else {"content-type": content_type}
        return httpx.Response(200, content=body, headers=headers)

    return mock_client(handler, max_retries=2)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", None])
@pytest.mark.parametrize("written", list(WRITTEN))
async def test_a_stream_answering_a_request_for_none_is_read_as_the_stream_it_is(
    content_type: str | None, written: str
) -> None:
    # Given an endpoint that answers a request that asked for no stream with a stream,
    # labelled as JSON (or not labelled)
    seen: list[httpx.Request] = []
    async with client_for(WRITTEN[written].encode(), content_type, seen) as llm:
        # When a completion is asked for, not streamed
        reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then the answer and its usage are read from it, in one attempt
    assert json.loads(await seen[0].aread()).get("stream") is None
    assert reply.content == '{"action": "x"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.attempts) == (4, 2, 1)
    assert reply.usage.finish_reasons == ("stop",)
    assert reply.usage.response_id == "c-1"


async def test_a_stream_labelled_as_json_answering_a_streamed_request_is_read_as_a_stream() -> None:
    seen: list[httpx.Request] = []
    async with client_for(STREAM.encode(), "application/json", seen) as llm:
        reply = await llm.complete_streaming(model="gpt-4.1", messages=MESSAGES)
    assert reply.content == '{"action": "x"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.attempts) == (4, 2, 1)


async def test_a_stream_whose_data_is_not_json_says_a_stream_came() -> None:
    # Given a stream, labelled as JSON, whose events are not OpenAI's chunks
    seen: list[httpx.Request] = []
    async with client_for(b"data: hello\n\ndata: world\n\n", "application/json", seen) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then the reason says a stream came where none was asked for, not that the body is not JSON
    assert raised.value.error_type == "malformed_response"
    assert "answered a stream (SSE) to a request that asked for none" in str(raised.value)
    assert "reply body is not JSON" not in str(raised.value)
    assert len(seen) == 1


@pytest.mark.parametrize(
    "body", [b"hello", b'{"choices": [', b"database: down"], ids=["text", "cut", "colon"]
)
async def test_a_body_that_is_neither_json_nor_a_stream_is_still_not_json(body: bytes) -> None:
    seen: list[httpx.Request] = []
    async with client_for(body, "application/json", seen) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert raised.value.error_type == "malformed_response"
    assert "reply body is not JSON" in str(raised.value)


COMPLETION = {
    "id": "c-2",
    "model": "gpt-4.1",
    "choices": [{"message": {"content": '{"action": "y"}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3},
}
JSON_BODIES = {
    "compact": json.dumps(COMPLETION).encode(),
    "pretty-printed": json.dumps(COMPLETION, indent=2).encode(),
    "after a blank line and a byte-order mark": b"\xef\xbb\xbf\n" + json.dumps(COMPLETION).encode(),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["not streamed", "streamed"])
@pytest.mark.parametrize("written", list(JSON_BODIES))
async def test_a_json_completion_labelled_as_a_stream_is_read_as_the_json_it_is(
    streamed: bool, written: str
) -> None:
    # Given a proxy that labels every answer text/event-stream, here a whole JSON completion:
    # it was read as a stream with no event in it, "stream ended before [DONE]", and retried
    # (each attempt an answer the provider billed)
    seen: list[httpx.Request] = []
    async with client_for(JSON_BODIES[written], "text/event-stream", seen) as llm:
        call = llm.complete_streaming if streamed else llm.complete
        reply = await call(model="gpt-4.1", messages=MESSAGES)
    # Then its answer and usage are taken, at the first attempt
    assert reply.content == '{"action": "y"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.attempts) == (5, 3, 1)
    assert len(seen) == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["not streamed", "streamed"])
async def test_a_json_error_labelled_as_a_stream_is_read_as_the_error_it_is(streamed: bool) -> None:
    body = json.dumps({"error": {"message": "Invalid 'messages'", "type": "invalid_request_error"}}).encode()
    seen: list[httpx.Request] = []
    async with client_for(body, "text/event-stream", seen) as llm:
        call = llm.complete_streaming if streamed else llm.complete
        with pytest.raises(LlmCallFailed) as raised:
            await call(model="gpt-4.1", messages=MESSAGES)
    assert raised.value.error_type == "reply_request_error"
    assert "Invalid 'messages'" in str(raised.value)
    assert "stream" not in str(raised.value).split(": ", 1)[1]
    assert len(seen) == 1
