"""Waiting for a task's lock shared by engines (``postgres/classification_locks.py``), for the
router's model calls that one engine should make for all: a classification, a ranking.

The wait is bounded and polls (a session-level advisory lock has no wait with a timeout that
leaves no transaction open); the lock is only an optimisation, so a caller that could not take
it in time, or could not ask, goes ahead without it."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Protocol
from uuid import UUID


class TaskLocks(Protocol):
    """Locks on tasks shared by engines on one database (``postgres/classification_locks.py``)."""

    def try_lock(self, task_id: UUID, purpose: str) -> bool | None:
        """True when taken, False when held elsewhere, None when the database could not be asked."""

    def unlock(self, task_id: UUID, purpose: str) -> None:
        """Let the lock go."""


async def take_lock(
    locks: TaskLocks, task: UUID, purpose: str, *, wait_s: float, poll_s: float
) -> tuple[bool, bool]:
    """Take the task's lock for ``purpose``, waiting up to ``wait_s`` (asking again every
    ``poll_s``) while another engine holds it: (taken, waited). Not taken when the wait ran out
    or the database could not be asked."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait_s
    waited = False
    while True:
        attempt = asyncio.ensure_future(asyncio.to_thread(locks.try_lock, task, purpose))
        try:
            taken = await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(partial(_unlock_if_taken, loop, locks, task, purpose))
            raise
        if taken is not False or loop.time() >= give_up:
            return bool(taken), waited
        waited = True
        await asyncio.sleep(poll_s)


async def let_go(locks: TaskLocks, task: UUID, purpose: str) -> None:
    """Let the task's lock for ``purpose`` go, even when the caller is cancelled meanwhile."""
    await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(locks.unlock, task, purpose)))


def _unlock_if_taken(
    loop: asyncio.AbstractEventLoop,
    locks: TaskLocks,
    task: UUID,
    purpose: str,
    attempt: asyncio.Future[bool | None],
) -> None:
    # The caller was cancelled while the lock was being taken: let it go if it was.
    if not attempt.cancelled() and attempt.exception() is None and attempt.result():
        loop.run_in_executor(None, locks.unlock, task, purpose)
