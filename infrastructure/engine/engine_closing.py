"""How an engine closes (``Engine.close``, ``Engine.aclose``): an engine of ``for_tenant`` stops
only its own services; the engine that opened the store also closes every engine made over it,
then the store and the connections and threads they shared."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from flowledger.domain.errors import EngineClosed
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.budgets import BudgetService
from flowledger.infrastructure.engine.checkpointer import Checkpointer
from flowledger.infrastructure.engine.steps import StepService
from flowledger.infrastructure.engine.tasks import TaskService
from flowledger.infrastructure.engine.tenant_engines import TenantEngines
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.classification_locks import ClassificationLocks


class OpenCheck:
    """Whether one engine is open: its store, and for an engine of ``for_tenant`` its own close
    too, since the store it shares stays open (a closed tenant's engine went on writing, and
    reading a task index it had stopped keeping up to date)."""

    def __init__(self, app: FlowledgerApplication) -> None:
        self._app = app
        self.closed = False

    def ensure_open(self, operation: str) -> None:
        """EngineClosed once this engine or its store is closed."""
        if self.closed:
            raise EngineClosed(operation)
        self._app.ensure_open(operation)


@dataclass(frozen=True, slots=True)
class OwnedStore:
    """What only the engine that opened the store closes."""

    app: FlowledgerApplication
    tenant_engines: TenantEngines[Any]
    checkpointer: Checkpointer | None
    agent_locks: AgentLocks | None
    agent_lender: AgentLockLender | None
    classification_locks: ClassificationLocks | None


class EngineClosing:
    """Closes one engine's services, and the store if it owns it (``owned``), once: closes made
    at once (two threads, ``aclose`` beside ``close``) are one, the later waiting for the first
    to end (every wait of a close is bounded), and a close after that does nothing. The second
    of two closes at once found nothing to give up and closed the store while the first was still
    recording the steps it gave up: an outside probe saw three of eight left pending under their
    leases."""

    def __init__(
        self,
        opened: OpenCheck,
        tasks: TaskService,
        steps: StepService,
        budgets: BudgetService,
        owned: OwnedStore | None,
    ) -> None:
        self._opened = opened
        self._tasks = tasks
        self._steps = steps
        self._budgets = budgets
        self._owned = owned
        self._state = threading.Condition()
        self._closer: int | None = None
        """The thread of the close under way (for ``aclose``, its loop's)."""
        self._done = False

    def close(self) -> None:
        """``Engine.close``."""
        if self._begin(threading.get_ident()):
            try:
                self._close()
            finally:
                self._end()

    async def aclose(self) -> None:
        """``Engine.aclose``: the adapter and the alert notifier closed too."""
        # Waited for off the loop: a close under way on another thread may need this loop to end.
        if await asyncio.to_thread(self._begin, threading.get_ident()):
            try:
                await self._aclose()
            finally:
                self._end()

    def _begin(self, closer: int) -> bool:
        """Whether the caller (of thread ``closer``) is to close: not once closed, nor when a close
        is under way, which it waits for first, unless that close is its own thread's (made inside
        it, or on the loop of an ``aclose`` under way): that one cannot end while it waits."""
        with self._state:
            while self._closer is not None and self._closer != closer:
                self._state.wait()
            if self._done or self._closer is not None:
                return False
            self._closer = closer
            return True

    def _end(self) -> None:
        with self._state:
            self._done = True
            self._closer = None
            self._state.notify_all()

    def _close(self) -> None:
        self._opened.closed = True
        self._tasks.close()
        owned = self._owned
        if owned is None:
            self._steps.close(executor=False)  # the threads are the owner's
            return
        for tenant_engine in owned.tenant_engines.made():
            tenant_engine.close()
        if owned.checkpointer is not None:
            owned.checkpointer.close()
        self._steps.close()
        self._budgets.close()
        _close_store(owned)

    async def _aclose(self) -> None:
        self._opened.closed = True
        owned = self._owned
        if owned is None:
            await asyncio.to_thread(self._close)
            return
        for tenant_engine in owned.tenant_engines.made():
            await asyncio.to_thread(tenant_engine.close)
        if owned.checkpointer is not None:
            owned.checkpointer.close()
        self._tasks.close()
        await self._steps.aclose()
        if self._budgets.notifier is not None:
            await self._budgets.notifier.aclose()
        self._budgets.close()
        _close_store(owned)


def _close_store(owned: OwnedStore) -> None:
    """The lock connections, then the store's pool."""
    if owned.agent_locks is not None:
        owned.agent_locks.close()
    if owned.agent_lender is not None:
        owned.agent_lender.close()
    if owned.classification_locks is not None:
        owned.classification_locks.close()
    owned.app.close()
