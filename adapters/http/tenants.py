"""The tenants' engines of the HTTP service: made on first use, the most recently used kept.

Every tenant's engine shares the base engine's store (``Engine.for_tenant``), but holds
services of its own: its task index, steps in flight, and a listener called on every save of
the shared store. Kept for ever, as they were, each tenant ever seen cost memory and a call on
every save, without bound. At most ``Settings.http_max_tenant_engines`` are kept (the base
engine's own tenant beside them); past it the least recently used engine that no request is
using is closed, and made again on its tenant's next request. An engine a request holds is
never closed under it: it is closed when its last request ends, if it is still past the bound.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine


class Tenants:
    """One engine per tenant over the base engine's store, the ``limit`` most recently used
    kept (``Settings.http_max_tenant_engines`` unless given). A request takes its tenant's
    engine with ``acquire`` and gives it back with ``release``."""

    def __init__(self, base: Engine, *, limit: int | None = None) -> None:
        self.base = base
        self.limit = base.settings.http_max_tenant_engines if limit is None else limit
        if self.limit < 1:
            raise ValidationError("http_max_tenant_engines", f"must be at least 1, got {self.limit}")
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._users: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The tenants' engines kept now (the base engine not counted)."""
        with self._lock:
            return len(self._engines)

    def acquire_kept(self, tenant: str) -> Engine | None:
        """``acquire`` for a tenant whose engine is kept now (never blocks), else None."""
        if tenant == self.base.tenant:
            return self.base
        with self._lock:
            engine = self._engines.get(tenant)
            if engine is None:
                return None
            self._engines.move_to_end(tenant)
            self._users[tenant] += 1
            return engine

    def acquire(self, tenant: str) -> Engine:
        """The tenant's engine, made the first time (``prepare``), held for a request until
        ``release`` (blocking, when it is made)."""
        while (engine := self.acquire_kept(tenant)) is None:
            self.prepare(tenant)  # again only if closed in between, as the least recently used
        return engine

    def prepare(self, tenant: str) -> None:
        """Make the tenant's engine, unless it is kept, as the most recently used, held by no
        request (blocking: it opens no connection, but a new tenant's name is checked in the
        database). Making one may close the least recently used engines no request holds, past
        the limit. Apart from ``acquire_kept`` so that a request cancelled while it waits for
        this in a thread holds nothing it would never release."""
        if tenant == self.base.tenant:
            return
        with self._lock:
            if tenant in self._engines:
                return
            self._engines[tenant] = self.base.for_tenant(tenant)
            idle = self._past_limit(spare=tenant)  # not the one made for a request about to take it
        _close(idle)

    def release(self, tenant: str) -> None:
        """A request is done with the tenant's engine (from ``acquire``)."""
        if tenant == self.base.tenant:
            return
        with self._lock:
            self._users[tenant] -= 1
            if self._users[tenant] <= 0:
                del self._users[tenant]
            idle = self._past_limit()
        _close(idle)

    def _past_limit(self, *, spare: str | None = None) -> list[Engine]:
        """Take out of the map the least recently used engines no request holds (but ``spare``),
        while more than ``limit`` are kept (under the lock); the caller closes them, outside it."""
        idle: list[Engine] = []
        excess = len(self._engines) - self.limit
        if excess <= 0:
            return idle
        for tenant in list(self._engines):  # oldest first
            if self._users[tenant] == 0 and tenant != spare:  # a Counter's read adds no key
                idle.append(self._engines.pop(tenant))
                excess -= 1
                if excess == 0:
                    break
        return idle

    def close(self) -> None:
        """Close the engines made here (the base engine, and the store they share, belong to the
        app's caller)."""
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
            self._users.clear()
        _close(engines)


def _close(engines: list[Engine]) -> None:
    for engine in engines:
        engine.close()
