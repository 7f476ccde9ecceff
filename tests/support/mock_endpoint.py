"""The real LLM client against an endpoint a test writes as a function (httpx's MockTransport).

For replies no server in the tests gives on cue: error bodies of a chosen shape, size or label.
Retries do not sleep (``no_sleep``): a test counts attempts, it does not wait for them.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table

BASE_URL = "https://llm.test/v1"
"""Where the mocked endpoint is (no request leaves the process)."""


async def no_sleep(_: float) -> None:
    """A retry's pause, not taken."""
    return None


def mock_client(
    handler: Callable[[httpx.Request], httpx.Response], *, max_retries: int = 0
) -> OpenAICompatibleClient:
    """The client with the shipped prices, ``max_retries`` retries, its every request answered
    by ``handler``."""
    config = ClientConfig(base_url=BASE_URL, api_key=ApiKey("sk-test-secret-1"), max_retries=max_retries)
    return OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=no_sleep
    )
