"""The engines ``Engine.for_tenant`` makes over one store: each tenant's name checked and
admitted, and every one of them closed with the engine that opened the store."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.settings import Settings


class TenantEngine(Protocol):
    """What the registry reads of an engine: its settings and tenant, and how to close it."""

    settings: Settings
    tenant: str

    def close(self) -> None: ...


E = TypeVar("E", bound=TenantEngine)


class TenantEngines(Generic[E]):
    """Held by the engine that opened the store and shared by every engine made over it."""

    def __init__(
        self,
        app: FlowledgerApplication,
        database_url: str,
        admit: Callable[[str, Settings], object],
        make: Callable[[Settings], E],
    ) -> None:
        self._app = app
        self._database_url = database_url
        self._admit = admit
        """Admits a new tenant's name (``domain.tenant_names``) before its engine is made."""
        self._make = make
        """``settings.tenant``'s engine over the store."""
        self._made: weakref.WeakSet[E] = weakref.WeakSet()

    def engine_for(self, asked: E, tenant: str) -> E:
        """``Engine.for_tenant`` asked of ``asked``: itself for its own tenant, else a new engine."""
        self._app.ensure_open("make a tenant's engine")
        if tenant is None:  # with_overrides reads None as "keep this engine's": not a tenant
            raise ValidationError("tenant", "must be a non-empty string, got None")
        settings = asked.settings.with_overrides(tenant=tenant)  # the name checked as any tenant's
        if settings.tenant == asked.tenant:
            return asked
        self._admit(self._database_url, settings)
        made = self._make(settings)
        self._made.add(made)
        return made

    def made(self) -> list[E]:
        """The engines made and not yet collected, to close with the store."""
        return list(self._made)
