"""A reply whose headers are long or many (a gateway's debug header, a long cookie, a proxy's
trace headers) is read by aiohttp's transport, the default, as httpx's pool reads it: past
aiohttp's own limits (8,190 bytes a header, 128 headers) the answer the provider had billed
failed as "the reply is not readable HTTP", a connection error retried into the same reply,
each attempt billed, where httpx's pool (100 KiB of headers) took it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from tests.unit.test_llm_transports import served

MESSAGES = [{"role": "user", "content": "hello"}]
OK_BODY = {
    "id": "c-1",
    "model": "gpt-4.1",
    "choices": [{"message": {"content": '{"action": "x"}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 2},
}
HEADERS: dict[str, dict[str, str]] = {
    "one of 20 KiB": {"x-debug": "x" * 20 * 1024},
    "200 of 100 bytes": {f"x-trace-{n}": "v" * 100 for n in range(200)},
}


async def _no_sleep(_: float) -> None:
    return None


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("headers", list(HEADERS))
async def test_a_reply_with_long_or_many_headers_is_read_on_both_transports(kind: str, headers: str) -> None:
    # Given an endpoint whose answer comes with long or many headers
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=OK_BODY, headers=HEADERS[headers])

    options: dict[str, Any] = {"transport": kind, "max_retries": 2}
    async with served(handler) as url:
        config = ClientConfig(base_url=url, api_key=ApiKey("sk-test-secret-1"), **options)
        async with OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=_no_sleep) as llm:
            # When a completion is asked for
            reply = await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then its answer is taken, at the first attempt
    assert reply.content == '{"action": "x"}'
    assert (reply.usage.attempts, len(seen)) == (1, 1)
