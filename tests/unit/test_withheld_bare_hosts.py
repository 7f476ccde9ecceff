"""Host names and addresses an endpoint's error names without a URL around them are withheld
too: ``Name or service not known: llm-gw.corp.local`` passed the filter whole, as did a host
with its port (``gateway.local:443``, ``llm-gw:8080``). Ordinary words, numbers, model names,
file names, field paths (``messages.0.content``, as pydantic and Anthropic name a field) and
Python's error names are left alone. Where the error's words say a host follows (``Name or
service not known:``, ``getaddrinfo failed for``, ``Cannot connect to host``, ``connect to``),
the word after them is withheld even without a dot or a port: ``Name or service not known:
llm-gw`` passed whole."""

from __future__ import annotations

import pytest

from flowledger.adapters.http.model_failures import withheld

WITHHELD = [
    (
        "Cannot connect to host llm.internal:8443 ssl:default",
        "Cannot connect to host [host withheld] ssl:default",
    ),
    (
        "[Errno -2] Name or service not known: llm-gw.corp.local",
        "[Errno -2] Name or service not known: [host withheld]",
    ),
    ("connect to 10.1.2.3:8080", "connect to [address withheld]"),
    ("connect to llm-gw:8080 refused", "connect to [host withheld] refused"),
    ("Connection refused: gateway.local:443.", "Connection refused: [host withheld]."),
    ("getaddrinfo failed for api.openai.com", "getaddrinfo failed for [host withheld]"),
    ("lookup of llm.svc.cluster.local failed", "lookup of [host withheld] failed"),
    ("proxy localhost:3128 refused the tunnel", "proxy [host withheld] refused the tunnel"),
    ("TLS handshake with gateway.corp failed", "TLS handshake with [host withheld] failed"),
    ("connect call failed [fd00::5]:8080", "connect call failed [address withheld]"),
    ("no route to LLM-GW.CORP.LOCAL:8443", "no route to [host withheld]"),
    ("lookup of 1.pool.llm.corp failed", "lookup of [host withheld] failed"),
    ("no answer from llm-gw.acme.tech", "no answer from [host withheld]"),
    ("no answer from gateway.acme.de", "no answer from [host withheld]"),
    # One word, no dot, no port, where the error's words say a host follows
    ("[Errno -2] Name or service not known: llm-gw", "[Errno -2] Name or service not known: [host withheld]"),
    ("Name or service not known: gateway", "Name or service not known: [host withheld]"),
    ("getaddrinfo failed for gateway", "getaddrinfo failed for [host withheld]"),
    ("getaddrinfo failed for llm_gw.", "getaddrinfo failed for [host withheld]."),
    ("getaddrinfo failed for gateway:8080", "getaddrinfo failed for [host withheld]"),
    ("Cannot connect to host gateway ssl:default", "Cannot connect to host [host withheld] ssl:default"),
    ("could not connect to gateway (refused)", "could not connect to [host withheld] (refused)"),
    ("Failed to connect to llmproxy port 8080", "Failed to connect to [host withheld] port 8080"),
]
KEPT = [
    "retry after 1.5 s",
    "Please try again in 1.5s.",
    "model gpt-4o-mini and claude-3.5-sonnet failed",
    "gemini-2.5-flash, gpt-4.1-mini, qwen2.5-coder and llama3.1 are not served",
    "anthropic.claude-3-5-sonnet-20240620-v1:0 is not available",
    "Invalid 'messages[0].content': expected a string, got null.",
    "body.model: field required",
    "messages.0.content: Input should be a valid list",
    "input.messages.content is required",
    "body.messages.1.role: field required",
    "HTTP 400: tools.0.function.name: String should match pattern",
    "see prices.json and client.py",
    "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
    "httpx.ConnectError: [Errno 111] Connection refused",
    "Limit 200000, Used 199500, Requested 1200 at 2026-12-08T00:30:00Z",
    "e.g. a timeout; i.e. nothing came back.",
    "HTTP 503 server_error: The server is overloaded",
    "x-ratelimit-remaining-requests:0 left",
    "[Errno -2] Name or service not known",
    "Cannot connect to host",
    "failed to connect to the endpoint within 10s",
    "unable to connect to an upstream: no healthy upstream",
    "getaddrinfo failed",
]


@pytest.mark.parametrize(("message", "shown"), WITHHELD, ids=[f"withheld-{n}" for n in range(len(WITHHELD))])
def test_a_bare_host_or_address_in_an_error_is_withheld(message: str, shown: str) -> None:
    assert withheld(message) == shown


@pytest.mark.parametrize("message", KEPT, ids=[f"kept-{n}" for n in range(len(KEPT))])
def test_words_numbers_and_model_names_in_an_error_are_kept(message: str) -> None:
    assert withheld(message) == message
