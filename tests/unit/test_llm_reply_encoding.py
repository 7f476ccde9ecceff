"""A reply's bytes are read as text the way its stream's are: bytes that are not UTF-8 become
U+FFFD, and a charset the reply declares is the one it is read in (both transports)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

MESSAGES = [{"role": "user", "content": "hello"}]
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}
GPT_41_COST = Decimal("0.0028")  # 1,000 x $2/M + 100 x $8/M, the body's usage at list price


def answering(body: bytes, content_type: str) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return handler


def completion(content: bytes) -> bytes:
    return (
        b'{"id": "chatcmpl-1", "model": "gpt-4.1", "choices": [{"message": {"role": "assistant", "content": "'
        + content
        + b'"}, "finish_reason": "stop"}], "usage": '
        + json.dumps(USAGE).encode()
        + b"}"
    )


def stream(content: bytes) -> bytes:
    first = {"id": "chatcmpl-1", "model": "gpt-4.1", "choices": [{"delta": {"content": "The "}}]}
    last = {"id": "chatcmpl-1", "choices": [], "usage": USAGE}
    return (
        b"data: "
        + json.dumps(first).encode()
        + b'\n\ndata: {"id": "chatcmpl-1", "choices": [{"delta": {"content": "'
        + content
        + b'"}, "finish_reason": "stop"}]}\n\ndata: '
        + json.dumps(last).encode()
        + b"\n\ndata: [DONE]\n\n"
    )


@pytest.mark.parametrize(
    ("streamed", "body", "kind"),
    [
        (False, completion(b"caf\xe9"), "application/json"),
        (True, stream(b"caf\xe9"), "text/event-stream"),
        (True, completion(b"caf\xe9"), "application/json"),  # a proxy that ignores stream
    ],
    ids=["json", "stream", "stream-answered-as-json"],
)
async def test_a_reply_with_bytes_that_are_not_utf8_is_the_answer_priced_as_its_usage_says(
    transport: Transports, streamed: bool, body: bytes, kind: str
) -> None:
    # Given: a paid answer whose text holds a Latin-1 byte (caf\xe9), as a broken proxy sends it
    llm = await transport.client(answering(body, kind))
    # When
    call = llm.complete_streaming if streamed else llm.complete
    reply = await call(model="gpt-4.1", messages=MESSAGES)
    # Then: taken, as a stream holding that byte always was, and priced from its usage
    assert reply.content.endswith("caf\ufffd")
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (1000, 100)
    assert reply.usage.cost_usd == GPT_41_COST
    assert reply.usage.attempts == 1
    assert not reply.usage.unpriced


@pytest.mark.parametrize("charset", ["iso-8859-1", "windows-1252", "utf-16"])
async def test_a_reply_is_read_in_the_charset_it_declares(transport: Transports, charset: str) -> None:
    body = completion("café".encode()).decode().encode(charset)
    llm = await transport.client(answering(body, f"application/json; charset={charset}"))
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert reply.content == "café"
    assert reply.usage.cost_usd == GPT_41_COST


@pytest.mark.parametrize("charset", ["iso-8859-1", "us-ascii", "windows-1252"])
async def test_a_utf8_reply_labelled_with_another_charset_is_read_as_the_utf8_it_is(
    transport: Transports, charset: str
) -> None:
    # Servers that label every JSON body ISO-8859-1 and write UTF-8 (an old servlet default) are
    # commoner than JSON in Latin-1: read so, "café" became "cafÃ©", the answer changed silently
    body = completion("café ☃".encode())
    llm = await transport.client(answering(body, f"application/json; charset={charset}"))
    reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert reply.content == "café ☃"
