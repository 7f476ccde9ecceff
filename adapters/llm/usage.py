"""Turning one call's reply and attempts into an LlmUsage: tokens per type, exact cost, attempt log.

Every attempt the provider billed (it reported usage: the answer, a 2xx body that could not
be read, a stream cut after its usage chunk) is priced on its own, in the attempt log. The
usage's token fields and ``cost_usd`` are the last attempt's (the answer, when there is one);
what the attempts before it were billed is ``retried_cost_usd``, for the tokens summed in
``retried_tokens``. A provider's own charge
(OpenRouter's ``usage.cost``) overrides the price table for its attempt. An attempt billed for
what is not known (a request that went out and whose reply was lost: timed out, dropped or
cancelled; a stream that began and was cut, timed out or cancelled before its usage chunk),
like an answer that reports no usage or counts that cannot be read, makes the call
``unpriced`` and ``billed_unreported``: never a silent $0, and no repricing makes it one.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

from flowledger.adapters.llm.completion import ParsedCompletion
from flowledger.adapters.llm.reported_usage import ReportedUsage
from flowledger.adapters.llm.retry import AttemptOutcome
from flowledger.domain.pricing import EXACT, ModelPrice
from flowledger.domain.values import LlmUsage, plain_decimal


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """What is fixed for one call before its first attempt (clock readings in seconds).

    ``price`` is None for a model without a price (its usage is flagged ``unpriced``);
    ``estimated_prompt_tokens`` is the prompt's rough size (``estimate_prompt_tokens``), kept
    when an attempt was billed for tokens it did not report. ``priced_as``: the price table's
    name for the model that answered, when its price replaced the one asked for
    (``OpenAICompatibleClient.priced_as_served``); "" otherwise.
    """

    provider: str
    model: str
    price: ModelPrice | None
    price_version: str
    stream: bool
    queued: float
    started: float
    estimated_prompt_tokens: int = 0
    priced_as: str = ""


def attempt_cost(price: ModelPrice | None, tokens: ReportedUsage) -> Decimal | None:
    """What one attempt was billed: the provider's charge, else its tokens at ``price``; None
    when neither is known (no price, or counts that could not be read)."""
    if tokens.provider_cost_usd is not None:
        return tokens.provider_cost_usd
    if price is None or tokens.unreadable:
        return None
    return price.cost(**tokens.counts())


def build_usage(
    call: CallContext, parsed: ParsedCompletion | None, outcomes: list[AttemptOutcome], now: float
) -> LlmUsage:
    """The usage of a call that ended at ``now`` (``parsed`` is None when it failed)."""
    log: list[dict[str, Any]] = []
    retried = Decimal(0)
    retried_tokens: dict[str, int] = {}
    billed = 0
    unpriced = unreported = unreadable = False
    cost: Decimal | None = None
    for index, outcome in enumerate(outcomes):
        entry: dict[str, Any] = {
            "n": outcome.number,
            "outcome": outcome.error_type,
            "status": outcome.status_code,
            "ms": round(outcome.elapsed_ms, 3),
            "waited_s": round(outcome.waited_before_s, 3),
        }
        if outcome.usage is not None:
            cost = attempt_cost(call.price, outcome.usage)
            entry["usage"] = outcome.usage.counts()
            entry["cost_usd"] = None if cost is None else plain_decimal(cost)
            if outcome.usage.unreadable:  # why its cost is not known
                entry["unreadable_usage"] = list(outcome.usage.unreadable)
                # Counts it could not read stand as zeros: no price table may price them.
                unreadable = unreadable or cost is None
            billed += 1
            unpriced = unpriced or cost is None
            if index < len(outcomes) - 1:
                for name, count in outcome.usage.counts().items():
                    retried_tokens[name] = retried_tokens.get(name, 0) + count
                if cost is not None:
                    with localcontext(EXACT):
                        retried += cost
        elif outcome.billed_unreported:
            # The provider had the prompt (its reply was lost, or its stream ended before the
            # usage chunk): billed, for what is not known. What is known is kept; no token
            # count is made up.
            entry["usage_reported"] = False
            entry["cost_usd"] = None
            if call.stream:
                entry["streamed_chars"] = outcome.streamed_chars
            unreported = True
        log.append(entry)
    # Without a price, a call nothing was reported for is unpriced too: never a silent $0.
    unpriced = unpriced or unreported or (call.price is None and not billed)
    extra: dict[str, Any] = {
        "streamed": call.stream,
        "rate_limit_wait_ms": round((call.started - call.queued) * 1000, 3),
        "attempt_log": log,
    }
    if call.priced_as:
        extra["priced_as"] = call.priced_as
    if unreported:
        extra["estimated_prompt_tokens"] = call.estimated_prompt_tokens
        if outcomes[-1].billed_unreported:  # the usage's token fields are that attempt's: none
            extra["usage_reported"] = False
    if parsed is not None and call.stream:
        ttft = parsed.time_to_first_token_ms
        extra["time_to_first_token_ms"] = round(ttft, 3) if ttft is not None else None
    silent = parsed is not None and not parsed.tokens.reported
    if silent:
        # An answer that does not say what it used: its cost is not known, never a silent $0.
        extra["usage_reported"] = False
        unpriced = True
    last = outcomes[-1].usage if outcomes else None
    tokens = last if last is not None else ReportedUsage()
    if last is None:
        cost = attempt_cost(call.price, tokens)
    # Otherwise the loop priced the last attempt already (pricing is a tenth of a call's client CPU).
    return LlmUsage(
        provider=call.provider,
        request_model=call.model,
        response_model=(parsed.response_model if parsed else "") or call.model,
        finish_reasons=parsed.finish_reasons if parsed else (),
        response_id=parsed.response_id if parsed else "",
        cost_usd=cost if cost is not None else Decimal(0),
        price_version=call.price_version,
        latency_ms=round((now - call.started) * 1000, 3),
        attempts=len(outcomes),  # 0 when no request went out (the breaker refused the call)
        extra=extra,
        unpriced=unpriced,
        cost_source="provider" if tokens.provider_cost_usd is not None else "",
        retried_cost_usd=retried,
        retried_tokens=retried_tokens,
        billed_unreported=unreported or silent or unreadable,
        **tokens.counts(),
    )
