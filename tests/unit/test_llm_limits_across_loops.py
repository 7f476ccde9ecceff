"""A model's rate limits hold for the whole client, whatever event loops it is used from.

The limiter kept a bucket pair per event loop (aiolimiter's belong to the loop that first waits
on them): a script that runs ``asyncio.run`` once per step started each step with a full
bucket, and threads with loops of their own each had the whole rate. Under ``rpm=2``, two calls
in one loop and then four ``asyncio.run`` calls sent six requests to the simulator in under a
second; now the loops share one bucket pair.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from flowledger.adapters.llm.config import ModelLimits
from flowledger.adapters.llm.resilience import LOCAL_RATE_LIMIT, ModelRateLimiter
from flowledger.adapters.llm.retry import AttemptError

WITHIN_S = 0.2
"""How long a request may wait for room: a minute's limits leave none for that long."""


def admitted(limiter: ModelRateLimiter) -> bool:
    """Whether one request of 10 tokens gets under ``limiter``'s limits, in a loop of its own."""

    async def ask() -> bool:
        try:
            await limiter.acquire("m", 10, within=WITHIN_S)
        except AttemptError as refused:
            return refused.error_type != LOCAL_RATE_LIMIT  # another refusal fails the comparison
        return True

    return asyncio.run(ask())


@pytest.mark.parametrize(
    "limits", [ModelLimits(rpm=2, tpm=100_000), ModelLimits(rpm=100, tpm=20)], ids=["rpm", "tpm"]
)
def test_a_loop_per_request_gets_no_fresh_limits(limits: ModelLimits) -> None:
    limiter = ModelRateLimiter({}, default=limits)
    # Two requests fit in the minute; each of the next loops finds no room
    assert [admitted(limiter) for _ in range(4)] == [True, True, False, False]


def test_threads_with_loops_of_their_own_share_the_limits() -> None:
    limiter = ModelRateLimiter({}, default=ModelLimits(rpm=2, tpm=100_000))
    start = threading.Barrier(4, timeout=5)
    results: list[bool] = []

    def run() -> None:
        start.wait()
        results.append(admitted(limiter))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    # Two of four got in: each thread's loop had the whole rate (four got in)
    assert sorted(results) == [False, False, True, True]
