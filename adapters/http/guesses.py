"""Refused keys per client address: past a limit, an address's requests are answered 429 before
their key is looked up, so guessing costs the database nothing.

Each address may have ``failures`` keys refused per window of ``window_s`` seconds, counted from
its first refusal; after that its requests are 429 until the window ends (``Retry-After``). Only a
token that is no key's counts (unknown, mistyped or malformed), never a request that sent none (a
browser opening the dashboard page before its login is no guess), nor a revoked or expired key
(its holder has a real token: a client left with a stale key must not lock out the other keys
of its address). Lookups under way count as refusals until they end (``admit``, ``settle``), so
guesses sent all at once get no more lookups than guesses sent one by one; the same token sent
many times at once counts once, so a client's burst with its good key is never refused. A key served from
an address is not held to that address's limit for ``GOOD_S`` after its last good request
(``served``): one tenant's refused keys no longer lock out the others calling from one server. The
counts live in memory, in a ``cachetools.TTLCache``: an entry leaves when its window ends, and
the cache holds at most ``MAX_ADDRESSES`` (the least recently seen dropped first), so an
attacker rotating addresses cannot grow it without bound. IPv6 addresses are counted per /64,
the block one subscriber is usually given. The model calls' buckets (``SharedBucket``) do not
fit here: they wait for room, and these are judged without waiting.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass

from cachetools import TTLCache

MAX_ADDRESSES = 10_000
"""The most addresses whose refusals are remembered (a few MB at most)."""
GOOD_S = 3600.0
"""How long a key served from an address stays exempt there from the address's limit, since its
last good request: one Dify server calls for many tenants, and one tenant's refused keys
locked every other tenant's calls out of it for the window, again and again."""


@dataclass
class _Window:
    """One address's refusals since ``started`` (monotonic seconds)."""

    started: float
    count: int = 0


class Guesses:
    """Refused keys per client address, for the gate (``auth.Gate.known``)."""

    def __init__(self, failures: int, window_s: float, *, max_addresses: int = MAX_ADDRESSES) -> None:
        self.failures, self.window_s = failures, window_s
        # An entry is stored once, at its first refusal, and only mutated after: storing it again
        # would restart its time to live, and with it the window.
        self._windows: TTLCache[str, _Window] = TTLCache(max_addresses, window_s, timer=time.monotonic)
        # The tokens each address has being looked up now (bounded by the requests in flight).
        self._pending: dict[str, Counter[bytes]] = {}
        # Keys served from an address (by digest): guessed by no one, so never held to its limit.
        self._good: TTLCache[tuple[str, bytes], bool] = TTLCache(
            max_addresses, max(window_s, GOOD_S), timer=time.monotonic
        )
        self._lock = threading.Lock()  # the login form and the routes may run in other threads

    def __len__(self) -> int:
        with self._lock:
            self._windows.expire()
            return len(self._windows)

    def wait(self, address: str | None) -> float:
        """0 when ``address`` may have its key looked up, else the seconds until it may."""
        with self._lock:
            window = self._windows.get(source_of(address))
            if window is None or window.count < self.failures:
                return 0.0
            return max(0.0, window.started + self.window_s - time.monotonic())

    def admit(self, address: str | None, token: bytes) -> float:
        """0 when ``address`` may have ``token`` (its digest) looked up now, else the seconds until it
        may; a 0 must be followed by ``settle``. A token already under way for the address always
        may; another may while the address's refusals and distinct tokens under way stay below
        the limit."""
        source = source_of(address)
        with self._lock:
            pending = self._pending.setdefault(source, Counter())
            if token not in pending and (source, token) not in self._good:
                window = self._windows.get(source)
                refusals = window.count if window is not None else 0
                if refusals + len(pending) >= self.failures:
                    if not pending:
                        del self._pending[source]
                    if window is not None and refusals >= self.failures:
                        return max(0.0, window.started + self.window_s - time.monotonic())
                    return 1.0  # the lookups under way end within a second or two
            pending[token] += 1
            return 0.0

    def settle(self, address: str | None, token: bytes, *, refused: bool) -> None:
        """End a lookup ``admit`` let through, counting a refusal when the token was no key's."""
        source = source_of(address)
        with self._lock:
            pending = self._pending.get(source)
            if pending is not None:
                pending[token] -= 1
                if pending[token] <= 0:
                    del pending[token]
                if not pending:
                    del self._pending[source]
        if refused:
            self.refused(address)

    def served(self, address: str | None, token: bytes) -> None:
        """Remember that ``token`` (its digest) is a usable key from ``address``: its later requests
        from there are looked up whatever the address's refusals (``GOOD_S``)."""
        with self._lock:
            self._good[(source_of(address), token)] = True

    def refused(self, address: str | None) -> None:
        """Count a refused key from ``address``."""
        source = source_of(address)
        with self._lock:
            window = self._windows.get(source)
            if window is None:
                window = self._windows[source] = _Window(time.monotonic())
            window.count += 1


def retry_after(wait_s: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


def source_of(address: str | None) -> str:
    """What an address is counted as: itself, an IPv6 one's /64, ``unknown`` when not known."""
    if not address:
        return "unknown"
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:  # ::ffff:203.0.113.7 is that IPv4 address
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)
