"""In-process locks per aggregate key, so that writers of different aggregates never wait.

A fixed set of striped locks would make two unrelated sessions that hash to the same
stripe queue behind each other's database round trip (and nesting two such locks could
deadlock). Here each key has its own lock, created when a caller first asks for it and
dropped when the last caller holding or waiting for it leaves: a count under one short
guard, which costs less per write than a weak mapping's references and callbacks.
"""

from __future__ import annotations

import threading
from types import TracebackType


class LockWaitTimeout(Exception):
    """Another caller held a key's lock for longer than this caller could wait."""


class KeyedLocks:
    """``with locks(key):`` holds ``key``'s lock; thread-safe; no lock outlives its users."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()

    def __call__(self, key: str, timeout: float | None = None) -> _Hold:
        """A context manager holding ``key``'s lock (re-entering it from one thread blocks);
        with ``timeout``, waiting longer raises ``LockWaitTimeout``."""
        return _Hold(self, key, timeout)

    def __len__(self) -> int:
        """How many keys have a lock now (held or waited for; for tests)."""
        return len(self._entries)

    def _enter(self, key: str) -> _Entry:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        return entry

    def _leave(self, key: str, entry: _Entry) -> None:
        with self._guard:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class _Hold:
    """One caller's use of a key's lock: counted in on enter, out on exit."""

    __slots__ = ("_entry", "_key", "_locks", "_timeout")

    def __init__(self, locks: KeyedLocks, key: str, timeout: float | None) -> None:
        self._locks = locks
        self._key = key
        self._timeout = timeout

    def __enter__(self) -> None:
        entry = self._locks._enter(self._key)
        try:
            held = entry.lock.acquire(timeout=-1 if self._timeout is None else max(self._timeout, 0.0))
        except BaseException:  # interrupted while waiting: not a user any more
            self._locks._leave(self._key, entry)
            raise
        if not held:
            self._locks._leave(self._key, entry)
            raise LockWaitTimeout(self._key)
        self._entry = entry

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        entry = self._entry
        entry.lock.release()
        self._locks._leave(self._key, entry)
