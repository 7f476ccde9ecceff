"""An httpx transport that spreads requests over several connection pools.

httpcore 1.0's pool does work quadratic in its number of connections for every
request it assigns (``_assign_requests_to_connections`` counts all connections once
per idle connection). Above a few dozen concurrent requests that dominates: 50
concurrent calls to a local server were capped near 150 requests/s, nearly all of it
in that method. Pools of at most ``shard_size`` connections keep each scan short.
"""

from __future__ import annotations

import itertools
import math

import httpx


class ShardedTransport(httpx.AsyncBaseTransport):
    """Round-robins requests over ``ceil(max_connections / shard_size)`` httpx pools."""

    def __init__(self, *, limits: httpx.Limits, shard_size: int = 8) -> None:
        total = limits.max_connections or 100
        keepalive = limits.max_keepalive_connections
        shards = max(1, math.ceil(total / shard_size))
        per_shard = httpx.Limits(
            max_connections=math.ceil(total / shards),
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / shards),
            keepalive_expiry=limits.keepalive_expiry,
        )
        # One TLS context for all pools: loading the CA bundle costs ~30 ms each time.
        ssl_context = httpx.create_ssl_context()
        self.pools = [httpx.AsyncHTTPTransport(limits=per_shard, verify=ssl_context) for _ in range(shards)]
        self._next = itertools.cycle(self.pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send on the next pool in turn."""
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self.pools:
            await pool.aclose()
