"""A step cancelled during its model call keeps the call's attempts: the real client over a
mock transport, an in-memory engine (issue 19: every attempt accounted for)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.ports import CallEstimate
from flowledger.domain.session_views import StepFailure
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.budgets import Burn

MODEL = "deepseek-v3.2"
USAGE = {"prompt_tokens": 1000, "completion_tokens": 10}


class SlowEndpoint:
    """Answers the first ``refusals`` requests with 429, then (when ``cut_stream``) one stream
    cut before ``[DONE]`` after its usage chunk (billed, retried), then never answers until
    cancelled (or, when ``hang_streaming``, begins a stream and never sends its usage chunk);
    ``hanging`` is set once a request hangs."""

    def __init__(self, refusals: int = 0, cut_stream: bool = False, hang_streaming: bool = False) -> None:
        self.refusals, self.cut_stream, self.hang_streaming = refusals, cut_stream, hang_streaming
        self.requests = 0
        self.hanging = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.requests <= self.refusals:
            return httpx.Response(429, headers={"retry-after": "0"}, json={"error": "slow down"})
        if self.cut_stream and self.requests == self.refusals + 1:
            chunks = [
                {"id": "c1", "model": MODEL, "choices": [{"delta": {"content": "Hel"}}]},
                {"id": "c1", "model": MODEL, "choices": [], "usage": USAGE},
            ]
            text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)
        if self.hang_streaming:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._begun())
        self.hanging.set()
        await asyncio.sleep(3600)
        raise AssertionError("the test cancels before this")

    async def _begun(self) -> AsyncIterator[bytes]:
        chunk = {"id": "c2", "model": MODEL, "choices": [{"delta": {"content": "Hel"}}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        self.hanging.set()
        await asyncio.sleep(3600)


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")))
    yield engine
    engine.close()


def client(endpoint: SlowEndpoint, *, stream: bool = False) -> OpenAICompatibleClient:
    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey("sk-test-key"), default_model=MODEL, stream=stream
    )
    return OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(endpoint), retry_sleep=_no_sleep
    )


async def _no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


async def _cancel_while_hanging(engine: Engine, endpoint: SlowEndpoint) -> None:
    task = asyncio.create_task(engine.process_step("s1", "greet", {"q": "hi"}, idempotency_key="k1"))
    await asyncio.wait_for(endpoint.hanging.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_cancelled_mid_request_records_its_model_and_the_cancelled_attempt(
    engine: Engine,
) -> None:
    endpoint = SlowEndpoint(refusals=0)
    engine.llm = client(endpoint)
    engine.start_session("s1", "cs")
    await _cancel_while_hanging(engine, endpoint)
    (failure,) = engine.get_session("s1").failures
    assert failure.error_type == "cancelled"
    assert failure.usage is not None
    assert failure.usage.request_model == MODEL
    log = failure.usage.extra["attempt_log"]
    assert [(entry["n"], entry["outcome"]) for entry in log] == [(1, "cancelled")]
    assert failure.usage.attempts == 1
    assert failure.usage.cost_usd == Decimal(0)


async def test_attempts_billed_before_the_cancel_stay_in_the_books(engine: Engine) -> None:
    endpoint = SlowEndpoint(refusals=1, cut_stream=True)
    engine.llm = client(endpoint, stream=True)
    engine.start_session("s1", "cs")
    await _cancel_while_hanging(engine, endpoint)
    (failure,) = engine.get_session("s1").failures
    assert failure.usage is not None
    log = failure.usage.extra["attempt_log"]
    assert [entry["outcome"] for entry in log] == ["http_429", "connection_error", "cancelled"]
    assert log[1]["usage"]["input_tokens"] == 1000
    assert endpoint.requests == 3
    # The cut stream was billed: 1,000 input and 10 output tokens at deepseek-v3.2's documented
    # $0.28 and $0.42 per million (adapters/llm/prices.json): $0.00028 + $0.0000042.
    assert failure.usage.retried_cost_usd == Decimal("0.0002842")
    assert failure.usage.attempts == 3


async def _cancelled_under_a_budget(
    database_url: str, pg_schema: str, endpoint: SlowEndpoint, *, stream: bool = True
) -> tuple[StepFailure, Burn, Decimal]:
    """The step failure, the budget's burn and what the call held, after a step (streamed
    unless told) is cancelled while ``endpoint`` hangs, under a user's budget on PostgreSQL."""
    settings = Settings(home=Path("/nonexistent"), database_url=database_url, schema=pg_schema)
    llm = client(endpoint, stream=stream)
    held: list[Decimal] = []
    estimate = llm.max_cost

    def recording(model: str | None, messages: list[dict[str, Any]]) -> CallEstimate:
        made = estimate(model, messages)
        held.append(made.max_cost_usd)
        return made

    llm.max_cost = recording  # type: ignore[method-assign]
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.start_session("s1", "cs", user_id="alice")
        engine.budgets.set("user", "alice", "month", "5")
        await _cancel_while_hanging(engine, endpoint)
        (failure,) = engine.get_session("s1").failures
        [burn] = engine.budgets.burn()
        [hold] = held
        return failure, burn, hold
    finally:
        await engine.aclose()


@pytest.mark.postgres
async def test_a_budget_is_charged_what_a_cancelled_calls_attempts_were_billed(
    database_url: str, pg_schema: str
) -> None:
    failure, burn, held = await _cancelled_under_a_budget(
        database_url, pg_schema, SlowEndpoint(cut_stream=True)
    )
    # The cut stream's 1,000 input and 10 output tokens (see above) stay on the books; the
    # cancelled request, awaiting its reply, may have been billed too (for what is not known),
    # so the budget counts what the call held for it on top (the larger of the two alone, before:
    # the cancelled attempt went uncounted); and nothing is still held.
    assert failure.usage is not None
    assert (failure.usage.charged_usd, failure.usage.unpriced) == (Decimal("0.0002842"), True)
    assert burn.spent_usd == Decimal("0.0002842") + held
    assert burn.reserved_usd == Decimal(0)


@pytest.mark.postgres
@pytest.mark.parametrize("stream", [True, False], ids=["a stream that began", "a request awaiting its reply"])
async def test_a_call_cancelled_before_it_said_what_it_used_counts_its_estimate_against_budgets(
    database_url: str, pg_schema: str, stream: bool
) -> None:
    # Given a stream the provider began answering, or a request it has whole, cancelled before
    # the usage came
    endpoint = SlowEndpoint(hang_streaming=stream)
    failure, burn, held = await _cancelled_under_a_budget(database_url, pg_schema, endpoint, stream=stream)
    # Then the call's cost is not known (it was billed: not $0), and the budget counts the
    # most it could have cost, as it held
    assert failure.usage is not None
    assert (failure.error_type, failure.usage.unpriced) == ("cancelled", True)
    assert burn.spent_usd == held > 0
    assert burn.reserved_usd == Decimal(0)
