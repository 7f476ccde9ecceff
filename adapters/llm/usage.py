"""Turning one call's reply and attempts into an LlmUsage: tokens per type, exact cost, attempt log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowledger.adapters.llm.completion import ParsedCompletion
from flowledger.adapters.llm.retry import AttemptOutcome
from flowledger.domain.pricing import ModelPrice
from flowledger.domain.values import LlmUsage


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """What is fixed for one call before its first attempt (clock readings in seconds)."""

    provider: str
    model: str
    price: ModelPrice
    price_version: str
    stream: bool
    queued: float
    started: float


def build_usage(
    call: CallContext, parsed: ParsedCompletion | None, outcomes: list[AttemptOutcome], now: float
) -> LlmUsage:
    """The usage of a call that ended at ``now`` (``parsed`` is None when it failed)."""
    tokens = parsed.tokens if parsed is not None else None
    extra: dict[str, Any] = {
        "streamed": call.stream,
        "rate_limit_wait_ms": round((call.started - call.queued) * 1000, 3),
        "attempt_log": [
            {
                "n": o.number,
                "outcome": o.error_type,
                "status": o.status_code,
                "ms": round(o.elapsed_ms, 3),
                "waited_s": round(o.waited_before_s, 3),
            }
            for o in outcomes
        ],
    }
    if parsed is not None and call.stream:
        ttft = parsed.time_to_first_token_ms
        extra["time_to_first_token_ms"] = round(ttft, 3) if ttft is not None else None
    if tokens is not None and not tokens.reported:
        extra["usage_reported"] = False
    counts = {
        "input_tokens": tokens.input_tokens if tokens else 0,
        "output_tokens": tokens.output_tokens if tokens else 0,
        "cache_read_input_tokens": tokens.cache_read_input_tokens if tokens else 0,
        "reasoning_output_tokens": tokens.reasoning_output_tokens if tokens else 0,
    }
    return LlmUsage(
        provider=call.provider,
        request_model=call.model,
        response_model=(parsed.response_model if parsed else "") or call.model,
        finish_reasons=parsed.finish_reasons if parsed else (),
        response_id=parsed.response_id if parsed else "",
        cost_usd=call.price.cost(**counts),
        price_version=call.price_version,
        latency_ms=round((now - call.started) * 1000, 3),
        attempts=max(len(outcomes), 1),
        extra=extra,
        **counts,
    )
