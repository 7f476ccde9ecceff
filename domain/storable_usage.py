"""What of a model call's usage the ledger can keep when the provider's reply cannot be stored.

A provider may answer with strings PostgreSQL cannot hold (a NUL, a lone surrogate), a model
name or id longer than the ledger takes, or counts and costs past its bounds
(``require_usage``). The call was made and billed all the same, so the step's
``StepFailed("malformed_response")`` keeps its usage, made storable: characters that cannot
be stored become U+FFFD, texts are cut to their limits, numbers capped at theirs, and
``extra["unstorable"]`` says what was wrong and holds the reported values that were changed
(as text, cut), so nothing is silently smoothed over.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

from flowledger.domain.bounds import MAX_NAME_LENGTH, UNSTORABLE_CHARACTERS
from flowledger.domain.errors import ValidationError
from flowledger.domain.price_rule import TOKEN_FIELDS
from flowledger.domain.values import (
    MAX_ATTEMPTS,
    MAX_COST_USD,
    MAX_FINISH_REASONS,
    MAX_LATENCY_MS,
    MAX_TOKENS,
    USAGE_TEXT_LIMITS,
    LlmUsage,
    require_object,
    require_usage,
)

_SHOWN = 200
"""Characters of a changed value kept in ``extra["unstorable"]``."""


def storable_usage(usage: LlmUsage | None) -> LlmUsage | None:
    """``usage`` when ``require_usage`` takes it; else a copy within its bounds (see the module)."""
    if usage is None:
        return None
    try:
        return require_usage("usage", usage)
    except ValidationError as error:
        problem = str(error)
    changes: dict[str, Any] = {name: _text(getattr(usage, name), limit) for name, limit in USAGE_TEXT_LIMITS}
    changes.update({name: min(getattr(usage, name), MAX_TOKENS) for name in TOKEN_FIELDS})
    changes["attempts"] = min(usage.attempts, MAX_ATTEMPTS)
    changes["latency_ms"] = min(usage.latency_ms, MAX_LATENCY_MS)
    changes["cost_usd"] = _cost(usage.cost_usd)
    changes["retried_cost_usd"] = _cost(usage.retried_cost_usd)
    changes["retried_tokens"] = {name: min(count, MAX_TOKENS) for name, count in usage.retried_tokens.items()}
    changes["finish_reasons"] = tuple(
        _text(reason, MAX_NAME_LENGTH) or "?" for reason in usage.finish_reasons[:MAX_FINISH_REASONS]
    )
    as_reported = {
        name: repr(getattr(usage, name))[:_SHOWN]
        for name, value in changes.items()
        if value != getattr(usage, name)
    }
    try:
        require_object("usage.extra", usage.extra)
        extra = dict(usage.extra)
    except ValidationError:
        extra, as_reported["extra"] = {}, "not storable JSON"
    extra["unstorable"] = {"problem": problem[:1_000], "as_reported": as_reported}
    return require_usage("usage", dataclasses.replace(usage, **changes, extra=extra))


def _text(value: str, limit: int) -> str:
    """``value`` with what PostgreSQL cannot store replaced, cut to ``limit``; "" when blank."""
    cleaned = UNSTORABLE_CHARACTERS.sub("\ufffd", value)[:limit]
    return cleaned if cleaned.strip() else ""


def _cost(cost: Decimal) -> Decimal:
    """``cost`` capped at the most one call may cost, with at most 40 decimal places."""
    capped = min(cost, MAX_COST_USD)
    exponent = capped.as_tuple().exponent
    return Decimal(format(capped, ".40f")) if isinstance(exponent, int) and exponent < -40 else capped
