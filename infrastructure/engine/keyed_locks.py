"""In-process locks per aggregate key, so that writers of different aggregates never wait.

A fixed set of striped locks would make two unrelated sessions that hash to the same
stripe queue behind each other's database round trip (and nesting two such locks could
deadlock). Here each key has its own lock, created on first use and dropped when no
caller holds or waits for it.
"""

from __future__ import annotations

import threading
from weakref import WeakValueDictionary


class KeyedLocks:
    """``locks(key)`` is the one lock of ``key`` while anybody refers to it; thread-safe."""

    def __init__(self) -> None:
        self._locks: WeakValueDictionary[str, threading.Lock] = WeakValueDictionary()
        self._guard = threading.Lock()

    def __call__(self, key: str) -> threading.Lock:
        """The lock of ``key`` (keep the reference while using it, as ``with`` does)."""
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = threading.Lock()
                self._locks[key] = lock
            return lock

    def __len__(self) -> int:
        """How many keys have a live lock (for tests)."""
        return len(self._locks)
