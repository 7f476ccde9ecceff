"""Budget alert webhooks: a signed JSON POST per alert, retried by tenacity, never awaited by a step.

The body is the alert as JSON. ``X-Flowledger-Signature: t=<unix seconds>,v1=<hex>`` is
HMAC-SHA256 under the budget's webhook secret of ``<t>.<body>`` (the timestamp lets a
receiver refuse replays); ``X-Flowledger-Delivery`` is the same on every retry of one alert
(``<budget id>:<window start>:<threshold>``), so a receiver can drop duplicates. Transport
errors, 429 and 5xx are retried with jittered exponential backoff; other answers are final.

A webhook is a URL that whoever sets a budget chooses and the server then calls: unless
``FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE=1`` (``allow_private``), one whose host is, or resolves to,
an address that is not public (loopback, private, link-local such as a cloud's metadata
service at 169.254.169.254, unspecified, reserved) is not called, so a budget cannot make the
server reach its own network. The HTTP API refuses such a literal address when the budget is
set (``destination_refusal``); names are resolved and checked before each delivery, and the
call is made at the address checked (``pinned_request``: the name as ``Host`` and as the name
TLS checks the certificate against), so a name that answers a public address to the check and
a private one afterwards (DNS rebinding) is never looked up a second time, and a redirect
from the receiver is never followed, whatever the client given.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
import unicodedata
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from flowledger.adapters.llm.transport import shared_tls_context
from flowledger.domain.budget import BudgetAlert, listed_url
from flowledger.domain.errors import ValidationError
from flowledger.domain.values import plain_decimal

SIGNATURE_HEADER = "X-Flowledger-Signature"
DELIVERY_HEADER = "X-Flowledger-Delivery"
_log = logging.getLogger(__name__)


class _Retryable(Exception):
    """A 429 or 5xx answer: worth another attempt."""


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _literal_address(host: str) -> _Address | None:
    """The address ``host`` spells, in any form a resolver takes (``127.1``, ``2130706433``,
    ``0x7f.0.0.1``, ``[::ffff:127.0.0.1]``, ``①②⑦.0.0.1``, ``%31%32%37.0.0.1``); None for a name."""
    host = unicodedata.normalize("NFKC", unquote(host)).strip("[]")
    try:
        return _unmapped(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):  # not an address (ValueError: a NUL in it)
        return None


def _unmapped(address: _Address) -> _Address:
    """An IPv6 address that carries an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo
    client) as that IPv4 address: where a packet to it may end up."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if (address in _NAT64 or address in _IPV4_COMPATIBLE) and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _not_public(address: _Address) -> str | None:
    if address.is_global and not address.is_multicast:
        return None
    return f"{address} is not a public address"


def _hosts(url: str) -> list[str]:
    """The URL's host as the standard library reads it and as httpx (which makes the call)
    does: where two parsers disagree (``http://a@b\\@c/``), both are judged."""
    hosts = [urlsplit(url).hostname or ""]
    with contextlib.suppress(httpx.InvalidURL):  # then it cannot be called at all
        hosts.append(httpx.URL(url).host)
    return [host.rstrip(".").lower() for host in dict.fromkeys(hosts)]


def destination_refusal(url: str) -> str | None:
    """Why ``url`` may not be a webhook while private destinations are not allowed, judged
    without a lookup (a literal address that is not public, or ``localhost``); None if it may."""
    for host in _hosts(url):
        if host == "localhost" or host.endswith(".localhost"):
            return f"{host} is this machine"
        address = _literal_address(host)
        refusal = _not_public(address) if address is not None else None
        if refusal is not None:
            return refusal
    return None


def require_public_destination(url: str | None, *, allow_private: bool) -> None:
    """Raise ValidationError on ``webhook_url`` when ``url`` is refused by ``destination_refusal``
    and private destinations are not allowed (a budget being set: nothing is written)."""
    if url is None or allow_private:
        return
    refusal = destination_refusal(url)
    if refusal is not None:
        raise ValidationError("webhook_url", f"{refusal}; FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE=1 allows it")


async def resolved_destination(url: str) -> tuple[str | None, str | None]:
    """``destination_refusal``, then every address the URL's host resolves to checked alike:
    ``(why not, None)``, or ``(None, the address to connect to)``: the first the host of the
    call resolved to, so that the call makes no lookup of its own, whose answer could differ
    (DNS rebinding: public when checked, loopback when connecting)."""
    refusal = destination_refusal(url)
    if refusal is not None:
        return refusal, None
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    hosts = _hosts(url)
    called = hosts[-1]  # httpx's reading when it has one: the host the call goes to
    address = None
    for host in hosts:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            return f"{host} does not resolve: {error}", None
        for *_, sockaddr in found:
            if _not_public(_unmapped(ipaddress.ip_address(sockaddr[0]))) is not None:
                return f"{host} resolves to {sockaddr[0]}, which is not a public address", None
        if host == called and found:
            address = str(found[0][4][0])
    return None, address


async def resolved_refusal(url: str) -> str | None:
    """Why ``url`` may not be called, judged on every address its host resolves to; None if it may."""
    return (await resolved_destination(url))[0]


def pinned_request(url: str, address: str | None) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """The URL, extra headers and extensions of a call to ``url`` made at ``address``: the
    address in the URL, the name it was given as ``Host`` and, over TLS, as the name the
    server's certificate is checked against (SNI); ``url`` as it is when no address is given."""
    given = httpx.URL(url)
    if address is None:
        return given, {}, {}
    extensions: dict[str, Any] = {"sni_hostname": given.host} if given.scheme == "https" else {}
    return given.copy_with(host=address), {"Host": given.netloc.decode("ascii")}, extensions


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
        "spent_usd": plain_decimal(alert.spent_usd),
        "limit_usd": plain_decimal(spec.limit_usd),
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


MAX_ATTEMPTS = 100
"""The most deliveries one alert is tried (5 by default)."""
MAX_WAIT_S = 3_600.0
"""The longest timeout or wait between tries taken: an hour."""


def _require_options(
    client: object, attempts: object, allow_private: object, timeout_s: object, *waits: object
) -> None:
    """``WebhookNotifier``'s options as it delivers with them, else a ValidationError naming one."""
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise ValidationError("client", f"must be an httpx.AsyncClient or None, got {type(client).__name__}")
    if type(attempts) is not int or not 1 <= attempts <= MAX_ATTEMPTS:
        raise ValidationError(
            "attempts", f"must be a whole number from 1 to {MAX_ATTEMPTS}, got {attempts!r}"
        )
    if not isinstance(allow_private, bool):
        raise ValidationError("allow_private", f"must be True or False, got {allow_private!r}")
    for name, value, least in (
        ("timeout_s", timeout_s, _AFTER_ZERO),
        ("initial_wait_s", waits[0], 0.0),
        ("max_wait_s", waits[1], 0.0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float) or not least <= value <= MAX_WAIT_S:
            raise ValidationError(name, f"must be a number of seconds up to {MAX_WAIT_S:,.0f}, got {value!r}")


_AFTER_ZERO = 1e-9
"""The least timeout: a timeout of 0 failed every delivery."""


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
        allow_private: bool = False,
    ) -> None:
        """``allow_private``: also call webhooks on loopback, private and link-local addresses
        (``Settings.webhook_allow_private``; see the module's docstring). Each option is checked
        here: all were taken as given, ``allow_private="no"`` (true in Python) let alerts go to
        private addresses, ``attempts=0`` sent none, a NaN timeout failed every delivery."""
        _require_options(client, attempts, allow_private, timeout_s, initial_wait_s, max_wait_s)
        self._allow_private = allow_private
        self._client = client
        self._attempts = attempts
        self._timeout_s = timeout_s
        self._initial_wait_s = initial_wait_s
        self._max_wait_s = max_wait_s
        self._tasks: set[asyncio.Task[bool]] = set()
        self._threads: set[threading.Thread] = set()
        self.delivered = 0
        self.failed = 0
        self.refused = 0
        """Alerts not sent because their webhook's destination is not public (also in ``failed``)."""

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
        shown = listed_url(url, path=False)  # what the log names: never a password or a secret path
        address = None
        if not self._allow_private:
            refusal, address = await resolved_destination(url)
            if refusal is not None:
                _log.warning("budget alert webhook %s not called: %s", shown, refusal)
                self.refused += 1
                self.failed += 1
                return False
        target, pinned_headers, extensions = pinned_request(url, address)
        body = alert_body(alert)
        delivery = f"{alert.budget_id}:{alert.window_start.isoformat()}:{alert.threshold}"
        client = self._client or httpx.AsyncClient(timeout=self._timeout_s, verify=shared_tls_context())
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential_jitter(multiplier=self._initial_wait_s, max=self._max_wait_s),
                retry=retry_if_exception_type((httpx.TransportError, _Retryable)),
            ):
                with attempt:
                    headers = {
                        "Content-Type": "application/json",
                        DELIVERY_HEADER: delivery,
                        **pinned_headers,
                    }
                    if secret is not None:
                        headers[SIGNATURE_HEADER] = signature(secret, int(time.time()), body)
                    # Never followed, whatever the client's default: only the URL checked is called.
                    response = await client.post(
                        target, content=body, headers=headers, extensions=extensions, follow_redirects=False
                    )
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _Retryable(f"{shown} answered {response.status_code}")
                    if response.status_code >= 300:
                        _log.warning("budget alert webhook %s refused: %s", shown, response.status_code)
                        self.failed += 1
                        return False
        except (RetryError, httpx.TransportError, _Retryable) as error:
            _log.warning(
                "budget alert webhook %s gave up after %d attempts: %s", shown, self._attempts, error
            )
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
