"""The one test double of the LLM port, for tests that need a model the simulator cannot be.

Most tests that need a model use the real client against the built-in simulator
(``flowledger.adapters.simulator``); this double is for what a server cannot do on cue:
raise a chosen error, hold a call open while the test acts, yield a counted number of
times (to cancel a caller at each await point), or do something while a call is in flight.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from flowledger.domain.ports import LlmReply
from flowledger.domain.values import LlmUsage

STEP_DECISION = json.dumps(
    {"action": "classify", "context_update": {"intent": "refund"}, "next_step": "resolve", "message": "ok"}
)
"""A step reply as the prompt asks for it."""

USAGE = LlmUsage(
    provider="double",
    request_model="deepseek-v3.2",
    input_tokens=100,
    output_tokens=20,
    cost_usd=Decimal("0.0000364"),
    price_version="test",
    latency_ms=10.0,
)
"""What every answered call costs, unless the test says otherwise."""


@dataclass(frozen=True)
class Call:
    """One call the double received."""

    model: str | None
    messages: list[dict[str, Any]]
    json_mode: bool


class ScriptedLlm:
    """Answers ``content`` (or ``content(messages)``) with ``usage``, or raises ``error``.

    Before answering it runs ``meanwhile`` (once per call), yields to the event loop
    ``yields`` times, sleeps ``delay`` seconds and then waits for ``gate`` (when given) to be
    set; every call is kept in ``calls``.
    """

    def __init__(
        self,
        content: str | Callable[[list[dict[str, Any]]], str] = STEP_DECISION,
        *,
        usage: LlmUsage = USAGE,
        error: BaseException | None = None,
        delay: float = 0.0,
        yields: int = 0,
        meanwhile: Callable[[], object] | None = None,
        gate: asyncio.Event | None = None,
    ) -> None:
        self.content, self.usage, self.error = content, usage, error
        self.delay, self.yields, self.meanwhile, self.gate = delay, yields, meanwhile, gate
        self.calls: list[Call] = []

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        """The port's one method."""
        self.calls.append(Call(model, messages, json_mode))
        if self.meanwhile is not None:
            self.meanwhile()
        for _ in range(self.yields):
            await asyncio.sleep(0)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        content = self.content if isinstance(self.content, str) else self.content(messages)
        return LlmReply(content=content, usage=self.usage)
