"""The LLM adapter: an OpenAI-compatible client (retries, limits, breaker), prices.

``build_engine()`` gives an Engine whose ``process_step`` calls the endpoint named by
``FLOWLEDGER_LLM_BASE_URL`` with ``FLOWLEDGER_LLM_API_KEY``.

The names below are imported when first used (PEP 562): a module of this package that
needs no HTTP client (prices, settings from the environment) loads without httpx and
aiohttp, so the command line's other commands start without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowledger.adapters.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from flowledger.adapters.llm.alerts import WebhookNotifier
    from flowledger.adapters.llm.client import OpenAICompatibleClient
    from flowledger.adapters.llm.config import ApiKey, ClientConfig, ModelLimits
    from flowledger.adapters.llm.pricing import ModelPrice, PriceTable, load_price_table
    from flowledger.infrastructure import Engine, Settings

_EXPORTS = {
    "ApiKey": "flowledger.adapters.llm.config",
    "ClientConfig": "flowledger.adapters.llm.config",
    "ModelLimits": "flowledger.adapters.llm.config",
    "ModelPrice": "flowledger.adapters.llm.pricing",
    "OpenAICompatibleClient": "flowledger.adapters.llm.client",
    "PriceTable": "flowledger.adapters.llm.pricing",
    "WebhookNotifier": "flowledger.adapters.llm.alerts",
    "load_price_table": "flowledger.adapters.llm.pricing",
}


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)


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
    from flowledger.adapters.llm.alerts import WebhookNotifier
    from flowledger.adapters.llm.client import OpenAICompatibleClient
    from flowledger.infrastructure import Engine, Settings

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
