"""One load generator for several servers: requests spread over them like a balancer would,
latency kept per kind of operation, answers counted per server, refusals counted by status.

A request that is retried (a lost connection, 409 while a duplicate holds the step, 429,
502 from the model, 503) goes to the next server, as a balancer's retry would; only a
request that finally succeeded counts as acknowledged by the caller.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.cluster import WRITER, bearer

RETRIED = frozenset({409, 429, 502, 503})
"""Statuses a caller retries: the step is held by a duplicate, the rate, the model, the database."""


@dataclass(frozen=True)
class Latency:
    """One kind of operation: how many answered, and its latency percentiles (ms)."""

    kind: str
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def percentile(sorted_values: list[float], share: float) -> float:
    """The nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[rank - 1]


class Balancer:
    """HTTP clients to every server, with a writer's key; thread-safe counters."""

    def __init__(self, urls: list[str], *, timeout_s: float = 60.0) -> None:
        self.urls = urls
        self.clients = [httpx.Client(base_url=url, headers=bearer(WRITER), timeout=timeout_s) for url in urls]
        self.answered: Counter[int] = Counter()
        """Responses each server gave (any status)."""
        self.errors: Counter[str] = Counter()
        """``kind status`` or ``kind ExceptionName`` for every refused or failed attempt."""
        self.samples: dict[str, str] = {}
        """The first answer (or error) of each kind of refusal, for a report."""
        self._latencies: defaultdict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self.started = time.monotonic()

    def close(self) -> None:
        """Close every client."""
        for client in self.clients:
            client.close()

    def next_server(self) -> int:
        """Round robin over the servers."""
        return next(self._turn) % len(self.clients)

    def call(
        self, kind: str, server: int, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response | None:
        """One attempt at ``server``; the response, or None when no answer came."""
        began = time.perf_counter()
        try:
            response = self.clients[server].request(method, path, json=body)
        except httpx.TransportError as error:
            self._refused(f"{kind} {type(error).__name__}", str(error))
            return None
        elapsed = time.perf_counter() - began
        with self._lock:
            self.answered[server] += 1
            self._latencies[kind].append(elapsed)
        if response.status_code >= 400:
            self._refused(f"{kind} {response.status_code}", response.text)
        return response

    def _refused(self, what: str, detail: str) -> None:
        with self._lock:
            self.errors[what] += 1
            self.samples.setdefault(what, detail[:300])

    def deliver(
        self,
        kind: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        server: int | None = None,
        attempts: int = 8,
        pause_s: float = 0.1,
    ) -> httpx.Response | None:
        """Send until a success or a status not worth retrying, moving to the next server on each
        retry; the last response (None if no server answered)."""
        where = self.next_server() if server is None else server
        response = None
        for attempt in range(attempts):
            response = self.call(kind, where, method, path, body)
            if response is not None and response.status_code not in RETRIED:
                return response
            time.sleep(pause_s * (attempt + 1))
            where = (where + 1) % len(self.clients)
        return response

    def latencies(self) -> list[Latency]:
        """Each kind's count and percentiles, by kind."""
        with self._lock:
            kinds = {kind: sorted(values) for kind, values in self._latencies.items()}
        return [
            Latency(kind, len(v), percentile(v, 0.5) * 1000, percentile(v, 0.99) * 1000, v[-1] * 1000)
            for kind, v in sorted(kinds.items())
        ]

    def throughput(self, seconds: float | None = None) -> list[float]:
        """Responses per second each server gave, over ``seconds`` (default: since this was made)."""
        elapsed = seconds if seconds is not None else time.monotonic() - self.started
        with self._lock:
            return [self.answered[i] / elapsed for i in range(len(self.clients))]


def succeeded(response: httpx.Response | None, statuses: Iterable[int] = (200, 201)) -> bool:
    """The response came and says done."""
    return response is not None and response.status_code in set(statuses)
