"""Ports: what the domain core needs from the outside world, as protocols.

The LLM adapter (``flowledger.adapters.llm``) implements ``LlmPort``; the Engine is
given one at construction and never imports the adapter itself. The prompts and the
parsers of the replies live in ``flowledger.domain.prompts``; the step ones are
re-exported here for callers that import them from the port.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from flowledger.domain.budget import BudgetAlert
from flowledger.domain.prompts import STEP_REPLY_KEYS, StepReply, parse_step_reply, step_messages
from flowledger.domain.values import LlmUsage

__all__ = [
    "STEP_REPLY_KEYS",
    "AlertNotifier",
    "CallEstimate",
    "CostEstimator",
    "LlmPort",
    "LlmReply",
    "ModelCheck",
    "ModelNames",
    "StepReply",
    "parse_step_reply",
    "step_messages",
]


@dataclass(frozen=True, kw_only=True)
class LlmReply:
    """A model's answer and what it cost; ``refusal``: the model's words when it declined to
    answer (OpenAI's ``message.refusal``), None when it did not."""

    content: str
    usage: LlmUsage
    refusal: str | None = None


class LlmPort(Protocol):
    """Calls a chat model once (with the adapter's own retries) and reports usage."""

    async def complete(
        self,
        *,
        model: str | None,
        messages: list[dict[str, Any]],
        json_mode: bool = True,
    ) -> LlmReply:
        """Return the reply, or raise an ``LlmError`` (a FlowledgerError) carrying usage so far.

        When the caller is cancelled, the ``CancelledError`` goes on; an adapter that knows the
        attempts made may set its ``usage`` attribute (an ``LlmUsage``, the cancelled attempt
        last) so the failure is recorded with what was billed.
        """
        ...


class PricedByClock(Protocol):
    """Optional beside LlmPort: an adapter that prices calls by the time they are made takes the
    engine's clock, so that every engine on a database picks the same price version."""

    def use_clock(self, now: Callable[[], datetime]) -> None:
        """Read the time of a call (the price in force) from ``now`` instead of the host."""
        ...


class ModelCheck(Protocol):
    """Optional beside LlmPort: refuse a model up front, before anything about the step is recorded."""

    def check_model(self, model: str | None) -> None:
        """Raise a FlowledgerError (``UnknownModelPrice``) for a model the adapter cannot call or price."""
        ...


class ModelNames(Protocol):
    """Optional beside LlmPort: the one name a model goes by, whatever name a call asks for it under."""

    def model_key(self, model: str | None) -> str:
        """The model a call asking for ``model`` is made with, under one name for all the names
        it is accepted by (an alias, a provider prefix, a dated release; None: the configured
        default), as its price, budgets and rate limits count it."""
        ...


@dataclass(frozen=True, kw_only=True)
class CallEstimate:
    """The most a call may cost, before it is made, and the model it will be made with."""

    model: str
    max_cost_usd: Decimal
    prompt_tokens: int
    max_output_tokens: int


class CostEstimator(Protocol):
    """Optional beside LlmPort: what a call can cost at most, for budgets to reserve up front."""

    def max_cost(self, model: str | None, messages: list[dict[str, Any]]) -> CallEstimate:
        """The estimated prompt tokens at the input price plus ``max_tokens`` at the output price."""
        ...


class AlertNotifier(Protocol):
    """Tells the outside world that a budget reached a threshold (a webhook, say); never blocks."""

    def notify(self, alert: BudgetAlert, secret: str | None) -> None:
        """Hand the alert over for delivery and return at once."""
        ...

    async def aclose(self) -> None:
        """Finish (or give up) deliveries under way."""
        ...
