"""Budget alert webhooks: a signed JSON POST per alert, retried by tenacity, never awaited by a step.

The body is the alert as JSON. ``X-Flowledger-Signature: t=<unix seconds>,v1=<hex>`` is
HMAC-SHA256 under the budget's webhook secret of ``<t>.<body>`` (the timestamp lets a
receiver refuse replays); ``X-Flowledger-Delivery`` is the same on every retry of one alert
(``<budget id>:<window start>:<threshold>``), so a receiver can drop duplicates. Transport
errors, 429 and 5xx are retried with jittered exponential backoff; other answers are final.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import threading
import time
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from flowledger.domain.budget import BudgetAlert

SIGNATURE_HEADER = "X-Flowledger-Signature"
DELIVERY_HEADER = "X-Flowledger-Delivery"
_log = logging.getLogger(__name__)


class _Retryable(Exception):
    """A 429 or 5xx answer: worth another attempt."""


def alert_body(alert: BudgetAlert) -> bytes:
    """The alert as the webhook's JSON body (amounts as exact decimal strings)."""
    spec = alert.spec
    payload: dict[str, Any] = {
        "type": "budget.alert",
        "tenant": alert.tenant,
        "budget_id": alert.budget_id,
        "scope": spec.scope,
        "subject": spec.subject,
        "period": spec.period,
        "mode": spec.mode,
        "window_start": alert.window_start.isoformat(),
        "threshold": alert.threshold,
        "spent_usd": str(alert.spent_usd),
        "limit_usd": str(spec.limit_usd),
    }
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Flowledger-Signature`` value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300.0) -> bool:
    """Whether ``header`` signs ``body`` under ``secret`` and is recent: what a receiver checks."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header)


class WebhookNotifier:
    """Delivers alerts in background tasks of the running loop (AlertNotifier)."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient | None = None,
        attempts: int = 5,
        timeout_s: float = 5.0,
        initial_wait_s: float = 0.2,
        max_wait_s: float = 10.0,
    ) -> None:
        self._client = client
        self._attempts = attempts
        self._timeout_s = timeout_s
        self._initial_wait_s = initial_wait_s
        self._max_wait_s = max_wait_s
        self._tasks: set[asyncio.Task[bool]] = set()
        self._threads: set[threading.Thread] = set()
        self.delivered = 0
        self.failed = 0

    def notify(self, alert: BudgetAlert, secret: str | None) -> None:
        """Start delivering ``alert`` and return at once: a task of the running loop, or (called
        from synchronous code, e.g. ``record_step``) a thread of its own."""
        if alert.spec.webhook_url is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            thread = threading.Thread(
                target=asyncio.run, args=(self._deliver(alert, secret),), name="flowledger-alert", daemon=True
            )
            self._threads.add(thread)
            thread.start()
            return
        task = loop.create_task(self._deliver(alert, secret))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, alert: BudgetAlert, secret: str | None) -> bool:
        url = alert.spec.webhook_url
        assert url is not None  # notify() passes only alerts with a URL
        body = alert_body(alert)
        delivery = f"{alert.budget_id}:{alert.window_start.isoformat()}:{alert.threshold}"
        client = self._client or httpx.AsyncClient(timeout=self._timeout_s)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential_jitter(multiplier=self._initial_wait_s, max=self._max_wait_s),
                retry=retry_if_exception_type((httpx.TransportError, _Retryable)),
            ):
                with attempt:
                    headers = {"Content-Type": "application/json", DELIVERY_HEADER: delivery}
                    if secret is not None:
                        headers[SIGNATURE_HEADER] = signature(secret, int(time.time()), body)
                    response = await client.post(url, content=body, headers=headers)
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _Retryable(f"{url} answered {response.status_code}")
                    if response.status_code >= 300:
                        _log.warning("budget alert webhook %s refused: %s", url, response.status_code)
                        self.failed += 1
                        return False
        except (RetryError, httpx.TransportError, _Retryable) as error:
            _log.warning("budget alert webhook %s gave up after %d attempts: %s", url, self._attempts, error)
            self.failed += 1
            return False
        finally:
            if self._client is None:
                await client.aclose()
        self.delivered += 1
        return True

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s``) for deliveries under way."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        await asyncio.to_thread(self.join_threads, timeout_s)

    def join_threads(self, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s`` in all) for deliveries started from synchronous code."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            if not thread.is_alive():
                self._threads.discard(thread)

    async def aclose(self) -> None:
        """Let deliveries under way finish (briefly), then cancel the rest."""
        await self.drain(self._timeout_s)
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
