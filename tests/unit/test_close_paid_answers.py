"""A model call that an engine's close gives up, but that was paid for all the same (it answered
as its cancel landed, or its cancelled attempt said what it used), keeps its cost on the log:
the close waits (within ``close_wait_s``) for the cancelled call to end and records what it used
on the step's ``StepFailed("engine_closed")``; a call that ends only after the close recorded the
step (its loop could not run meanwhile) is logged as a warning with what it used.

Observed: the answer was dropped (``AnswerNotSaved``) and the close's ``engine_closed`` carried no
usage, so the call's tokens and cost were in no event and the dashboard and budgets missed them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from flowledger.domain import StepInterrupted
from flowledger.domain.ports import CallEstimate, LlmReply
from flowledger.domain.session_leases import ENGINE_CLOSED
from flowledger.infrastructure import Engine
from tests.conftest import backend_engine
from tests.support.llm import STEP_DECISION, USAGE

HANG_S = 20.0
"""A bound on waits that end at once when the close does its part."""


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    yield from backend_engine(request, step_lease_s=30.0)


class PaidOnCancel:
    """A model that answers only once its call is cancelled: with its reply (it came as the cancel
    landed), or, ``as_error``, a ``CancelledError`` saying what the attempt used (``LlmPort``)."""

    def __init__(self, *, as_error: bool = False) -> None:
        self.as_error = as_error
        self.called = asyncio.Event()

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as cancelled:
            if self.as_error:
                cancelled.usage = USAGE  # type: ignore[attr-defined]
                raise
        return LlmReply(content=STEP_DECISION, usage=USAGE)

    def max_cost(self, model: str | None, messages: list[dict[str, Any]]) -> CallEstimate:
        """What a budget holds for the call, before it is made."""
        return CallEstimate(
            model=USAGE.request_model or "",
            max_cost_usd=Decimal("0.01"),
            prompt_tokens=100,
            max_output_tokens=100,
        )


@pytest.mark.parametrize("paid", ["answer", "cancelled_with_usage"])
async def test_a_call_given_up_by_a_close_but_paid_for_keeps_its_usage_on_the_log(
    engine: Engine, paid: str
) -> None:
    # Given a step in flight on one engine of a tenant, whose model is paid for as it is cancelled
    first, second = engine.for_tenant("t1"), engine.for_tenant("t1")
    first.start_session("s1", "cs")
    first.llm = model = PaidOnCancel(as_error=paid == "cancelled_with_usage")
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.wait_for(model.called.wait(), HANG_S)

    # When the engine closes
    await asyncio.to_thread(first.close)

    # Then the caller is told the step was given up, and the log holds what the call used
    with pytest.raises(StepInterrupted) as raised:
        await asyncio.wait_for(step, HANG_S)
    assert raised.value.given_up
    state = second.get_session("s1")
    assert state.pending == ()
    assert [(f.error_type, f.idempotency_key) for f in state.failures] == [(ENGINE_CLOSED, "k1")]
    usage = state.failures[0].usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (100, 20, USAGE.cost_usd)


async def test_a_paid_answer_that_comes_after_the_close_recorded_its_step_is_logged_with_its_usage(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a step in flight whose model answers once cancelled, on an engine closed from the
    # step's own event loop (the close cannot wait for it: the loop is the close's thread)
    first, second = engine.for_tenant("t1"), engine.for_tenant("t1")
    first.start_session("s1", "cs")
    first.llm = model = PaidOnCancel()
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.wait_for(model.called.wait(), HANG_S)

    # When the engine closes, then the loop runs on and the answer comes
    with caplog.at_level(logging.WARNING, logger="flowledger"):
        first.close()
        with pytest.raises(StepInterrupted) as raised:
            await asyncio.wait_for(step, HANG_S)

    # Then the step was given up without usage (the close recorded it first), and the answer's
    # usage is logged, naming the session and the key
    assert raised.value.given_up
    assert [(f.error_type, f.usage) for f in second.get_session("s1").failures] == [(ENGINE_CLOSED, None)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert all(
        words in warnings[0]
        for words in ("'s1'", "'k1'", "engine_closed", "100 input", "20 output", f"${USAGE.cost_usd}")
    ), warnings[0]


@pytest.mark.postgres
async def test_a_call_given_up_by_a_close_but_paid_for_is_charged_to_its_budget(
    pg_engine: Engine,
) -> None:
    # Given a budget, and a step in flight whose model is paid for as it is cancelled
    first = pg_engine.for_tenant("t1")
    first.start_session("s1", "cs")
    first.budgets.set("tenant", None, "month", "100")
    first.llm = model = PaidOnCancel()
    step = asyncio.ensure_future(first.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.wait_for(model.called.wait(), HANG_S)
    [held] = first.budgets.burn()
    assert held.reserved_usd == Decimal("0.01")

    # When the engine closes
    await asyncio.to_thread(first.close)
    with pytest.raises(StepInterrupted):
        await asyncio.wait_for(step, HANG_S)

    # Then the budget counts what the call cost, and holds nothing (it counted $0 before)
    [burn] = pg_engine.for_tenant("t1").budgets.burn()
    assert (burn.spent_usd, burn.reserved_usd) == (USAGE.cost_usd, Decimal(0))
