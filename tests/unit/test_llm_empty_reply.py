"""A 2xx with an empty body is reported as empty, with its status, not as "not JSON"."""

from __future__ import annotations

import httpx
import pytest

from flowledger.domain.errors import LlmCallFailed
from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("status", "headers", "stream"),
    [
        (200, {"content-type": "application/json"}, False),
        (200, {}, False),
        (201, {"content-type": "application/json"}, False),
        (200, {"content-type": "application/json"}, True),
    ],
    ids=["200-json-not-streamed", "200-no-type-not-streamed", "201-json-not-streamed", "200-json-streamed"],
)
async def test_an_empty_2xx_body_is_reported_as_empty_with_its_status(
    transport: Transports, status: int, headers: dict[str, str], stream: bool
) -> None:
    # Given an endpoint that answers 2xx with no body at all
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=b"", headers=headers)

    llm = await transport.client(handler, stream=stream)
    # When a completion is asked for
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then the failure says the body was empty and names the status (it said "reply body is
    # not JSON", as if something had been sent), and it is not retried, as a body cut short
    reason = str(raised.value)
    assert f"HTTP {status}" in reason
    assert "empty body" in reason
    assert "not JSON" not in reason
    assert (raised.value.error_type, len(seen)) == ("malformed_response", 1)


async def test_an_empty_event_stream_says_it_was_empty_and_is_retried_as_a_cut_stream(
    transport: Transports,
) -> None:
    # Given an endpoint that answers a streamed request 200 text/event-stream with no chunk
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"", headers={"content-type": "text/event-stream"})

    llm = await transport.client(handler, stream=True, max_retries=1, retry_sleep=_no_sleep)
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then it is a stream cut short (retried), and the reason says nothing came, with the status
    reason = str(raised.value)
    assert "stream ended before [DONE] with no chunk in it (HTTP 200, an empty stream)" in reason
    assert (raised.value.error_type, len(seen)) == ("connection_error", 2)


async def _no_sleep(_: float) -> None:
    return None
