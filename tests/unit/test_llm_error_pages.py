"""An error answered as a page (a gateway's 502, a CDN's 5xx, a proxy's 403) is named by its
title in the failure's reason: the reason was the page's first 300 characters of markup, and a
CDN's page, its title after a doctype and conditional comments, said nothing past its head."""

from __future__ import annotations

import httpx
import pytest

from flowledger.domain.errors import LlmCallFailed
from tests.support.mock_endpoint import mock_client

MESSAGES = [{"role": "user", "content": "hello"}]
CDN_PAGE = (
    b"<!DOCTYPE html>\n"
    b'<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->\n'
    b'<!--[if IE 7]>    <html class="no-js ie7 oldie" lang="en-US"> <![endif]-->\n'
    b'<head>\n<title>Bad gateway | 502: Bad gateway</title>\n<meta charset="UTF-8" />\n<style>'
    + b"body { margin: 0 } " * 150
    + b"</style></head><body><h1>Bad gateway</h1></body></html>"
)
NGINX_PAGE = (
    b"<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n"
    b"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
NGINX_TITLE = "an HTML page '503 Service Temporarily Unavailable'"
PAGES = {
    "a CDN's 502": (
        502,
        CDN_PAGE,
        "text/html; charset=UTF-8",
        "an HTML page 'Bad gateway | 502: Bad gateway'",
    ),
    "nginx's 503": (503, NGINX_PAGE, "text/html", NGINX_TITLE + " (text/html)"),
    "unlabelled": (500, NGINX_PAGE, None, NGINX_TITLE + " (no content-type)"),
    "no title": (
        403,
        b"<html><style>p { color: red }</style><body><!-- id 7 --><p>Forbidden</p></body></html>",
        "text/html",
        "an HTML page (text/html): Forbidden (after",
    ),
    "no title, no text": (403, b"<html><body></body></html>", "text/html", "an HTML page (text/html) (after"),
}


@pytest.mark.parametrize("page", list(PAGES))
async def test_an_error_answered_as_a_page_is_named_by_its_title(page: str) -> None:
    # Given an endpoint whose error comes as a page
    status, body, content_type, said = PAGES[page]

    def handler(_: httpx.Request) -> httpx.Response:
        headers = {} if content_type is None else {"content-type": content_type}
        return httpx.Response(status, content=body, headers=headers)

    llm = mock_client(handler)
    async with llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    # Then the reason names the page by its title, without its markup
    reason = str(raised.value)
    assert f"HTTP {status}: {said}" in reason
    assert "<" not in reason
    assert raised.value.error_type == f"http_{status}"


async def test_an_error_in_plain_text_is_still_shown_as_its_text() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="upstream connect error or disconnect/reset before headers")

    async with mock_client(handler) as llm:
        with pytest.raises(LlmCallFailed) as raised:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
    assert "HTTP 502: upstream connect error or disconnect/reset before headers" in str(raised.value)
