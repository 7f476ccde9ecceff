"""Command ids for commands without a caller's key: unique, unguessable, and made without a
system call.

``os.urandom`` per command released the GIL for its ``getrandom`` call, and with eight
writer threads each release meant queueing for the GIL again before the append
(bench/README.md, issue 11, third session). Here each id is a keyed BLAKE2b of a counter:
the key is drawn from ``os.urandom`` once per process (again in a forked child, which
would otherwise repeat its parent's ids), so ids differ across processes as random ones
do, and without the key nobody can tell the next one from the last.
"""

from __future__ import annotations

import hashlib
import itertools
import os

from flowledger.domain.aggregate import ENGINE_COMMAND_PREFIX


class CommandIds:
    """``ids()`` is a new ``cmd-`` + 32 hex digits id; thread-safe (the counter is one C call)."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._key = os.urandom(32)
        self._counter = itertools.count()

    def __call__(self) -> str:
        block = next(self._counter).to_bytes(16, "big")
        return ENGINE_COMMAND_PREFIX + hashlib.blake2b(block, key=self._key, digest_size=16).hexdigest()


new_command_id = CommandIds()
"""The process's generator (one per process: a fork reseeds it)."""
