"""Agent locks lent to one assignment batch at a time, for the tenants' engines of one store.

A batch holds its agent locks in the open transaction of an ``AgentLocks``' one connection,
so two batches cannot share one; one ``AgentLocks`` per tenant kept a connection per tenant
that ever assigned (an engine's first batch takes locks): 50 tenants, 54 connections. Lent
per batch, the connections follow the batches taking locks at once, not the tenants.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flowledger.infrastructure.postgres.agent_locks import AgentLocks


class AgentLockLender:
    """Lends an idle ``AgentLocks`` (its connection open) to a batch, or makes one."""

    def __init__(self, make: Callable[[], AgentLocks]) -> None:
        self._make = make
        self._idle: list[AgentLocks] = []
        self._made: list[AgentLocks] = []
        self._lock = threading.Lock()
        self._closed = False

    def borrow(self) -> AgentLocks:
        """Locks for one batch, until ``give_back`` (after its ``end``)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            locks = self._make()
            self._made.append(locks)
            return locks

    def give_back(self, locks: AgentLocks) -> None:
        """Take back locks whose batch ended (closed at once once the lender is closed)."""
        with self._lock:
            if not self._closed:
                self._idle.append(locks)
                return
        locks.close()

    @property
    def made(self) -> int:
        """How many ``AgentLocks`` (connections, once used) were ever made."""
        return len(self._made)

    def close(self) -> None:
        """Close every connection made."""
        with self._lock:
            self._closed = True
            made, self._made, self._idle = self._made, [], []
        for locks in made:
            locks.close()
