"""A bug in recording a model's answer fails the step at once instead of leaving it pending.

An outside probe: an exception that is no model error (a ``RuntimeError``, an
``AttributeError`` from a custom adapter's reply) raised while the step's outcome was being
written (``StepDecisions.finish``) went out to the caller as it was, and the step stayed
pending (StepStarted, no outcome) until its lease lapsed: the next caller of the key waited
out the whole lease. The attempt is now recorded as StepFailed (the error named, the answer's
cost kept) and the caller gets an ``LlmError`` saying the answer could not be recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flowledger.domain.errors import LlmError
from flowledger.domain.ports import LlmReply
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine import step_decisions
from tests.conftest import backend_engine
from tests.support.llm import USAGE, ScriptedLlm

LEASE_S = 30.0


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine with long leases (a step left pending would hold its key for 30 s), on each backend."""
    yield from backend_engine(request, step_lease_s=LEASE_S)


def broken_parser(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in reading the reply")


class ReplyWithoutText(ScriptedLlm):
    """A custom adapter whose reply holds no text (None where the port promises a string)."""

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        reply = await super().complete(model=model, messages=messages, json_mode=json_mode)
        return LlmReply(content=None, usage=reply.usage)  # type: ignore[arg-type]


async def test_a_bug_while_recording_the_answer_fails_the_step_at_once_with_its_cost(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model that answers, and a bug in the code that records its answer
    engine.start_session("s1", "cs")
    engine.llm = llm = ScriptedLlm()
    monkeypatch.setattr(step_decisions, "parse_step_reply", broken_parser)

    # When the step is processed
    with pytest.raises(LlmError) as raised:
        await engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="k1")

    # Then the caller is told the answer could not be recorded, the error named
    assert "RuntimeError" in str(raised.value)
    assert "a bug in reading the reply" in str(raised.value)
    assert raised.value.usage == USAGE
    # and the attempt is recorded as failed, with what the call cost: nothing stays pending
    state = engine.get_session("s1")
    assert state.pending == ()
    [failure] = state.failures
    assert failure.idempotency_key == "k1"
    assert failure.error_type == "RuntimeError"
    assert "a bug in reading the reply" in failure.error_message
    assert failure.usage == USAGE
    assert len(llm.calls) == 1
    # and a retry of the key is answered at once, not after the lease
    began = time.monotonic()
    with pytest.raises(LlmError):
        await asyncio.wait_for(
            engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="k1"), 10
        )
    assert time.monotonic() - began < 5
    # and the session takes its next step at once
    monkeypatch.undo()
    record = await asyncio.wait_for(
        engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="k2"), 10
    )
    assert record.usage == USAGE


async def test_an_adapters_reply_without_text_fails_the_step_instead_of_leaving_it_pending(
    engine: Engine,
) -> None:
    engine.start_session("s1", "cs")
    engine.llm = ReplyWithoutText()

    with pytest.raises(LlmError) as raised:
        await engine.process_step("s1", "greet", idempotency_key="k1")

    assert "AttributeError" in str(raised.value)
    state = engine.get_session("s1")
    assert state.pending == ()
    [failure] = state.failures
    assert failure.error_type == "AttributeError"
    assert failure.usage == USAGE
