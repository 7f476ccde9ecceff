"""An endpoint that redirects its route is told to the operator with where it redirects to
(both transports): the redirect is not followed, as it would carry the key and the prompt on."""

from __future__ import annotations

import httpx
import pytest

from flowledger.adapters.http.errors import status_for
from flowledger.domain.errors import LlmCallFailed
from tests.unit.test_llm_transports import Transports, transport_fixture  # noqa: F401 (a fixture)

MESSAGES = [{"role": "user", "content": "hello, in JSON"}]


def redirecting(status: int, location: str, seen: list[httpx.Request]) -> object:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            status,
            headers={"location": location, "content-type": "text/html"},
            content=b"<html><head><title>Moved</title></head><body>Moved</body></html>",
        )

    return handler


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_names_where_the_base_url_should_point(transport: Transports, status: int) -> None:
    # Given: an http:// base URL whose host redirects to https://
    seen: list[httpx.Request] = []
    llm = await transport.client(redirecting(status, "https://llm.example/v1/chat/completions", seen))
    # When
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then: one request, not retried, and the message says what to configure
    failed = raised.value
    assert len(seen) == 1
    assert failed.attempts == 1
    assert failed.error_type == "endpoint_redirected"
    assert failed.status_code == status
    assert "redirects POST" in str(failed)
    assert "to https://llm.example/v1/chat/completions" in str(failed)
    assert "give 'https://llm.example/v1' as the base URL" in str(failed)
    assert status_for(failed) == 502  # this server's configuration, not the caller's request


async def test_a_relative_redirect_is_named_whole_and_its_secrets_are_not(transport: Transports) -> None:
    seen: list[httpx.Request] = []
    llm = await transport.client(redirecting(307, "/proxy/v1/chat/completions?token=s3cret", seen))
    with pytest.raises(LlmCallFailed) as raised:
        await llm.complete(model="gpt-4.1", messages=MESSAGES)
    message = str(raised.value)
    assert "s3cret" not in message
    assert "/proxy/v1/chat/completions?***" in message
    assert message.count("://") >= 2  # the endpoint and where it redirects, both absolute
