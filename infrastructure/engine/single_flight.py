"""One call per key in a process: the first caller leads it, later callers on the same event
loop wait for its outcome (steps under one idempotency key, classifications of one task)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

K = TypeVar("K")
R = TypeVar("R")
T = TypeVar("T")


class LeaderGone(Exception):
    """The in-process caller leading the call was cancelled; the waiters start over."""


def retrieve_exception(future: asyncio.Future[Any]) -> None:
    """Waiters are optional: mark a leader's exception retrieved so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


async def lead(
    inflight: dict[K, tuple[R, asyncio.Future[T]]], key: K, request: R, run: Callable[[], Awaitable[T]]
) -> T:
    """Run ``run()`` as the leader of ``key``: while it runs, ``inflight[key]`` holds ``request``
    and a future that waiters ``asyncio.shield`` and get its result or error (``LeaderGone``
    if the leader is cancelled); the entry goes when it ends, unless another replaced it."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.add_done_callback(retrieve_exception)
    inflight[key] = (request, future)
    try:
        result = await run()
    except asyncio.CancelledError:
        future.set_exception(LeaderGone())
        raise
    except BaseException as error:
        future.set_exception(error)
        raise
    else:
        future.set_result(result)
        return result
    finally:
        if (current := inflight.get(key)) is not None and current[1] is future:
            del inflight[key]
