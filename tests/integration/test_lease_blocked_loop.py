"""A worker whose event loop the model call blocks keeps its lease: renewals are timed and
written off the loop, so no other caller takes the step over while the worker lives.

An outside probe (1 s leases; a model port that blocked its loop for 4 s, as a blocking
client inside the async port does): the renewals, loop timers, never ran; a caller in
another engine took the step over after 1.5 s and the model was called twice for one key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from flowledger.domain.ports import LlmReply
from flowledger.infrastructure import Engine
from tests.integration.test_step_takeover import keyed, run_in_thread
from tests.support.llm import ScriptedLlm
from tests.support.two_engines import two_engines

pytestmark = pytest.mark.postgres
LEASE_S = 1.0


class BlockingLlm(ScriptedLlm):
    """Answers after blocking its caller's event loop for ``block_s`` (a synchronous client)."""

    def __init__(self, block_s: float) -> None:
        super().__init__()
        self.block_s = block_s

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        time.sleep(self.block_s)
        return await super().complete(model=model, messages=messages, json_mode=json_mode)


@pytest.fixture
def engines(database_url: str, pg_schema: str) -> Iterator[tuple[Engine, Engine]]:
    with two_engines(database_url, pg_schema, LEASE_S) as pair:
        yield pair


def test_a_model_call_that_blocks_its_loop_past_the_lease_is_not_taken_over(
    engines: tuple[Engine, Engine],
) -> None:
    first, second = engines
    blocking, other = BlockingLlm(block_s=4 * LEASE_S), ScriptedLlm()
    first.llm, second.llm = blocking, other
    first.start_session("s", "customer_service")

    # Given a worker whose model call blocks its event loop for four leases
    worker, worker_ended = run_in_thread(first.process_step("s", "answer", {"q": "hi"}, idempotency_key="k"))
    time.sleep(1.5 * LEASE_S)
    # When a caller in another engine asks for the same key once a lease has gone by
    waiter, waiter_ended = run_in_thread(second.process_step("s", "answer", {"q": "hi"}, idempotency_key="k"))
    worker.join(timeout=30)
    waiter.join(timeout=30)

    # Then the model was called once, by the worker, and both got its step
    assert len(blocking.calls) == 1
    assert other.calls == []
    (mine,), (theirs,) = worker_ended, waiter_ended
    assert not isinstance(mine, BaseException), mine
    assert not isinstance(theirs, BaseException), theirs
    assert theirs.version == mine.version  # type: ignore[attr-defined]
    assert keyed(first, "s", "k") == [("StepStarted", None), ("StepProcessed", None)]
