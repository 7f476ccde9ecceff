"""An error answered as a list holding one error object, as Gemini's OpenAI-compatible endpoint
answers (``[{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}]``), is read
as that object: its reason was the list's raw JSON, and its 404 for a model it does not serve
was taken for a missing route ("check the base URL", a 502 instead of the caller's 422). An
error object that is the whole body (vLLM's) is read as one too: it was shown as raw JSON."""

from __future__ import annotations

import json

import httpx
import pytest

from flowledger.domain.errors import LlmCallFailed
from tests.support.mock_endpoint import mock_client

MESSAGES = [{"role": "user", "content": "hello"}]


def google_error(code: int, message: str, status: str) -> bytes:
    """Google's error body as its OpenAI-compatible endpoint sends it: a list of one."""
    return json.dumps([{"error": {"code": code, "message": message, "status": status}}], indent=2).encode()


CASES = {
    "400": (
        google_error(400, 'Invalid JSON payload received. Unknown name "reasoning"', "INVALID_ARGUMENT"),
        "http_400",
        1,
        'HTTP 400 INVALID_ARGUMENT (code 400): Invalid JSON payload received. Unknown name "reasoning"',
    ),
    "404": (
        google_error(404, "models/gemini-9.0-pro is not found for API version v1main", "NOT_FOUND"),
        "http_404",
        1,
        "HTTP 404 NOT_FOUND (code 404): models/gemini-9.0-pro is not found for API version v1main",
    ),
    "429": (
        google_error(429, "Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED"),
        "http_429",
        3,
        "HTTP 429 RESOURCE_EXHAUSTED (code 429): Resource has been exhausted (e.g. check quota).",
    ),
}


@pytest.mark.parametrize("status", list(CASES))
async def test_an_error_in_a_list_of_one_is_read_as_its_error_object(status: str) -> None:
    body, error_type, attempts, said = CASES[status]

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(int(status), content=body, headers={"content-type": "application/json"})

    llm = mock_client(handler, max_retries=2)
    async with llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    error = raised.value
    assert (error.error_type, error.attempts) == (error_type, attempts)
    assert said in str(error)
    assert "check the base URL" not in str(error)


async def test_an_error_object_at_the_top_of_the_body_is_read_as_one() -> None:
    # vLLM's ErrorResponse (before it was wrapped in "error"): the object is the whole body
    body = json.dumps(
        {
            "object": "error",
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    ).encode()

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(400, content=body, headers={"content-type": "application/json"})

    async with mock_client(handler, max_retries=2) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    said = "HTTP 400 BadRequestError (code 400): This model's maximum context length is 8192 tokens."
    assert said in str(raised.value)
    assert raised.value.error_type == "http_400"


async def test_an_error_body_after_a_byte_order_mark_is_read_as_json() -> None:
    # A server that writes UTF-8 with a byte-order mark (as .NET's UTF8Encoding does by
    # default): its completion was read, its error shown as raw text, its quota not seen.
    body = (
        b"\xef\xbb\xbf"
        + json.dumps(
            {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota"}}
        ).encode()
    )

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(429, content=body, headers={"content-type": "application/json"})

    llm = mock_client(handler, max_retries=2)
    async with llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert (raised.value.error_type, raised.value.attempts) == ("insufficient_quota", 1)
    assert "HTTP 429 insufficient_quota: You exceeded your current quota." in str(raised.value)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"error": {"message": "", "type": "server_error"}}', "HTTP 500 server_error: (no message)"),
        (b'{"error": {"message": " ", "code": 500}}', "HTTP 500 (code 500): (no message)"),
        (b'{"error": {"message": ""}}', "HTTP 500: (no message)"),
        (b'{"error": ""}', "HTTP 500: (no message)"),
        (b"", "HTTP 500: (no body)"),
    ],
    ids=["empty message", "blank message", "message alone", "empty string", "no body"],
)
async def test_an_error_object_with_no_message_says_so_not_that_there_was_no_body(
    body: bytes, said: str
) -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(500, content=body, headers={"content-type": "application/json"})

    async with mock_client(handler) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert f"{said} (after 1 attempt(s))" in str(raised.value)
