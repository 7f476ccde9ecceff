"""Ports: what the domain core needs from the outside world, as protocols.

The LLM adapter (``flowledger.adapters.llm``) implements ``LlmPort``; the Engine is
given one at construction and never imports the adapter itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flowledger.domain.values import LlmUsage


@dataclass(frozen=True, kw_only=True)
class LlmReply:
    """A model's answer and what it cost."""

    content: str
    usage: LlmUsage


class LlmPort(Protocol):
    """Calls a chat model once (with the adapter's own retries) and reports usage."""

    async def complete(
        self,
        *,
        model: str | None,
        messages: list[dict[str, Any]],
        json_mode: bool = True,
    ) -> LlmReply:
        """Return the reply, or raise ``LlmCallFailed`` (a FlowledgerError) carrying usage so far."""
        ...
