"""The LLM adapter: an OpenAI-compatible client (retries, limits, breaker), prices.

``build_engine()`` gives an Engine whose ``process_step`` calls the endpoint named by
``FLOWLEDGER_LLM_BASE_URL`` with ``FLOWLEDGER_LLM_API_KEY``.
"""

from __future__ import annotations

from typing import Any

from flowledger.adapters.llm.alerts import WebhookNotifier
from flowledger.adapters.llm.client import OpenAICompatibleClient
from flowledger.adapters.llm.config import ApiKey, ClientConfig, ModelLimits
from flowledger.adapters.llm.pricing import ModelPrice, PriceTable, load_price_table
from flowledger.infrastructure import Engine, Settings


def build_engine(
    database_url: str | None = None,
    *,
    settings: Settings | None = None,
    client_options: dict[str, Any] | None = None,
    **engine_options: Any,
) -> Engine:
    """An Engine wired to an OpenAICompatibleClient built from the same settings.

    ``client_options`` are ClientConfig fields (timeouts, limits, retries...);
    close it with ``await engine.aclose()``, which closes the client too.
    """
    base = settings if settings is not None else Settings.from_env()
    client = OpenAICompatibleClient.from_settings(base, **(client_options or {}))
    engine_options.setdefault("alerts", WebhookNotifier(allow_private=base.webhook_allow_private))
    return Engine(database_url, settings=base, llm=client, **engine_options)


__all__ = [
    "ApiKey",
    "ClientConfig",
    "ModelLimits",
    "ModelPrice",
    "OpenAICompatibleClient",
    "PriceTable",
    "WebhookNotifier",
    "build_engine",
    "load_price_table",
]
