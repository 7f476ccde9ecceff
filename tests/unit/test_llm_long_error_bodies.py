"""An error answer longer than a few KiB is read as the JSON it is: a 20 KiB error body (a long
message, or an error object padded with details) kept its type label, its quota and its
model-not-found meaning, as a short one does."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from flowledger.domain.errors import LlmCallFailed
from tests.support.mock_endpoint import mock_client

MESSAGES = [{"role": "user", "content": "hello"}]
PADDING = 20 * 1024
"""The size of each error body here: past the 8 KiB head the error fields were read from."""


def padded(error: dict[str, Any], where: str) -> bytes:
    """OpenAI's error body, pretty-printed as OpenAI sends it, made ``PADDING`` bytes long by a
    long ``message`` or by ``details`` after the error's fields."""
    if where == "message":
        error = {**error, "message": error["message"] + " " + "x" * PADDING}
    else:
        error = {**error, "details": [{"reason": "padding", "index": n} for n in range(PADDING // 30)]}
    body = json.dumps({"error": error}, indent=2).encode()
    assert len(body) > PADDING
    return body


QUOTA = {
    "message": "You exceeded your current quota, please check your plan and billing details.",
    "type": "insufficient_quota",
    "param": None,
    "code": "insufficient_quota",
}
MODEL_NOT_FOUND = {
    "message": "The model `gpt-9` does not exist or you do not have access to it.",
    "type": "invalid_request_error",
    "param": None,
    "code": "model_not_found",
}
INVALID = {
    "message": "Invalid 'messages[0].content': string too long.",
    "type": "invalid_request_error",
    "param": "messages",
    "code": "string_above_max_length",
}


async def failed_call(status: int, body: bytes) -> LlmCallFailed:
    """How a call fails against an endpoint answering every request ``status`` with ``body``."""

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})

    llm = mock_client(handler, max_retries=2)
    async with llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    return raised.value


@pytest.mark.parametrize("where", ["message", "details"])
async def test_a_20_kib_insufficient_quota_429_is_still_a_used_up_quota(where: str) -> None:
    # Given an endpoint whose 429 says the quota is used up, in a 20 KiB body
    error = await failed_call(429, padded(QUOTA, where))
    # Then it fails at once as a used-up quota, not retried as a rate limit
    assert (error.error_type, error.status_code, error.attempts) == ("insufficient_quota", 429, 1)
    assert "retrying will not help" in str(error)


@pytest.mark.parametrize("where", ["message", "details"])
async def test_a_20_kib_404_naming_the_model_is_the_models_404_not_the_routes(where: str) -> None:
    # Given an endpoint whose 404 says the model does not exist, in a 20 KiB body
    error = await failed_call(404, padded(MODEL_NOT_FOUND, where))
    # Then it is the caller's model that is missing (http_404), not the endpoint's route
    assert (error.error_type, error.status_code) == ("http_404", 404)
    assert "check the base URL" not in str(error)


@pytest.mark.parametrize("where", ["message", "details"])
async def test_a_20_kib_400_keeps_its_type_label_and_message(where: str) -> None:
    # Given an endpoint whose 400 comes in a 20 KiB body
    error = await failed_call(400, padded(INVALID, where))
    # Then its reason is OpenAI's error object read, not the body's raw text
    assert (error.error_type, error.status_code, error.attempts) == ("http_400", 400, 1)
    said = "HTTP 400 invalid_request_error (param messages, code string_above_max_length): Invalid"
    assert said in str(error)
    assert '{ "error"' not in str(error)
