"""A session's totals count the tokens of every attempt its cost counts: the retried ones too."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.session_views import Totals
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings

BILLED = {
    "prompt_tokens": 1_000,
    "completion_tokens": 100,
    "prompt_tokens_details": {"cached_tokens": 200},
    "completion_tokens_details": {"reasoning_tokens": 30},
}


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


def _cut_then_answered() -> Any:
    """A stream cut after its usage chunk (billed, retried), then an answer of the same size."""
    decision = json.dumps({"reply": "hi"})
    replies = iter(
        [
            _sse(
                {
                    "id": "r",
                    "model": "gpt-4.1",
                    "choices": [{"delta": {"content": "{"}, "finish_reason": None}],
                },
                {"choices": [], "usage": BILLED},
                done=False,
            ),
            _sse(
                {
                    "id": "r",
                    "model": "gpt-4.1",
                    "choices": [{"delta": {"content": decision}, "finish_reason": "stop"}],
                },
                {"choices": [], "usage": BILLED},
            ),
        ]
    )
    return lambda request: httpx.Response(200, content=next(replies))


async def _no_wait(_: float) -> None:
    return None


async def test_a_sessions_totals_count_the_tokens_of_every_attempt_they_count_the_cost_of() -> None:
    # Given a step whose first attempt was billed (its stream cut after the usage chunk) and retried
    config = ClientConfig(
        base_url="http://llm.test/v1", api_key=ApiKey("sk-test-0123456789"), transport="httpx", stream=True
    )
    llm = OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(_cut_then_answered()),
        retry_sleep=_no_wait,
        now=lambda: datetime(2026, 11, 30, 12, tzinfo=UTC),
    )
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")), llm=llm)
    try:
        engine.start_session("s1", "cs")
        # When it is processed
        record = await engine.process_step("s1", "greet", {"q": "hi"}, model="gpt-4.1")
        totals = engine.get_session("s1").totals
    finally:
        await engine.aclose()
    # Then the totals hold both attempts' cost and both attempts' tokens (they held $0.0056 and
    # 1,000 / 100 tokens: the answer's alone)
    assert record.usage is not None
    assert record.usage.attempts == 2
    assert totals.cost_usd == record.usage.charged_usd == 2 * record.usage.cost_usd > 0
    assert (totals.input_tokens, totals.output_tokens) == (2_000, 200)
    assert (totals.cache_read_input_tokens, totals.reasoning_output_tokens) == (400, 60)
    # And the reply's own fields stay the answer's, its retried attempts' apart
    assert (record.usage.input_tokens, record.usage.output_tokens) == (1_000, 100)
    assert record.usage.retried_tokens["input_tokens"] == 1_000


def test_a_usage_recorded_before_retried_tokens_were_kept_adds_what_it_did_then() -> None:
    """Events recorded before hold no ``retried_tokens``: folded now, they add what they added
    then, so a snapshot taken before (its totals folded the old way) still equals the fold of
    its events (``audit verify``), and no snapshot needs upgrading."""
    old = LlmUsage.from_dict(
        {"input_tokens": 10, "output_tokens": 5, "cost_usd": "0.2", "retried_cost_usd": "0.1", "attempts": 2}
    )
    assert "retried_tokens" not in old.to_dict()
    totals = Totals().add(old)
    assert (totals.input_tokens, totals.output_tokens, totals.cost_usd) == (10, 5, Decimal("0.3"))
