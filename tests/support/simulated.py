"""The real LLM client against the built-in simulator, and the providers' list prices to check it by.

The prices are typed here from the providers' pricing pages (the sources named in
``adapters/llm/prices.json``), not read from the shipped table: a test that compares what the
client charged with ``list_cost(exchange.reply)`` checks the client's reading of the usage and
its pricing against an oracle of its own.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table


@dataclass(frozen=True)
class ListPrice:
    """USD per million tokens: uncached input, cached input (a cache read), output."""

    input: Decimal
    cached: Decimal
    output: Decimal


LIST_PRICES = {
    # https://api-docs.deepseek.com/quick_start/pricing
    "deepseek-v3.2": ListPrice(Decimal("0.28"), Decimal("0.028"), Decimal("0.42")),
    # https://openai.com/api/pricing
    "gpt-4.1": ListPrice(Decimal("2.00"), Decimal("0.50"), Decimal("8.00")),
    # https://www.anthropic.com/pricing (prompts up to 200K tokens)
    "claude-sonnet-4.5": ListPrice(Decimal("3"), Decimal("0.30"), Decimal("15")),
    # https://ai.google.dev/gemini-api/docs/pricing (thinking tokens at the output price)
    "gemini-2.5-flash": ListPrice(Decimal("0.30"), Decimal("0.03"), Decimal("2.50")),
}


def list_cost(reply: dict[str, Any]) -> Decimal:
    """What a simulator's reply (a ``chat.completion`` body) costs at its model's list price.

    Cached prompt tokens are billed at the cache-read price, the rest of the prompt at the
    input price; reasoning tokens are inside ``completion_tokens``, at the output price.
    """
    usage, price = reply["usage"], LIST_PRICES[reply["model"]]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    uncached = usage["prompt_tokens"] - cached
    return (
        uncached * price.input + cached * price.cached + usage["completion_tokens"] * price.output
    ) / 10**6


_TLS = ssl.create_default_context()
"""Built once: a transport built without one loads the CA bundle each time (0.2 s per client on
the loaded test machine), though the simulator speaks plain HTTP."""


def simulated_client(base_url: str) -> OpenAICompatibleClient:
    """The real client for the simulator at ``base_url``, priced by the shipped table.

    It keeps no connection alive, so it may outlive the event loop that used it (a test
    server's, or a TestClient's) without a pooled connection bound to a closed loop; each loop
    that uses it (a TestClient's and a test's own, at once) gets a transport of its own.
    """
    config = ClientConfig(base_url=base_url, api_key=ApiKey("sk-test-simulator"))

    def transport() -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(verify=_TLS, limits=httpx.Limits(max_keepalive_connections=0))

    return OpenAICompatibleClient(config, prices=load_price_table(), transport=transport)
