"""The simulator's prompt cache: a prompt's longest prefix (its tools, then its messages) the same
model was sent before, reported as cached input as OpenAI reports it (1,024 tokens or more, in
128-token steps)."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowledger.adapters.simulator.replies import CACHE_STEP_TOKENS, message_tokens

PROMPTS_CACHED = 10_000
"""Prompt prefixes the simulator remembers (the oldest forgotten first): it kept every one it
saw, so a long run with prompts that differ grew without bound."""


@dataclass
class PromptCache:
    """Remembers the prefixes of the prompts each model was sent, at each message's end, so a
    prompt that begins with one is reported as that much cached input by the model that saw it
    (a provider's prompt cache is its model's: one prompt sent to gpt-4.1 was reported cached
    when gemini-2.5-flash first got it). OpenAI caches a prompt's prefix whatever its messages'
    roles: only a repeated system prompt was, so a long document sent twice in a user message,
    or a conversation's earlier turns sent again, were reported with nothing cached."""

    seen: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    """(model, SHA-256 of a prompt's messages up to one's end), least recently seen first."""

    def cached_tokens(
        self,
        model: str,
        messages: list[dict[str, Any]],
        min_tokens: int,
        *,
        tools: Sequence[dict[str, Any]] = (),
        tool_tokens: int = 0,
    ) -> int:
        """Tokens of the longest prefix of the prompt (ending at a message's end) that
        ``model`` was sent before, if it has ``min_tokens`` or more, in whole 128-token steps
        (OpenAI's rule: 1,100 tokens seen before are 1,024 cached); the prefixes of this
        prompt that are long enough are remembered.

        The prompt begins with the functions offered (``tools``, ``tool_tokens`` of them), as
        OpenAI's cached prefix does: the messages were hashed alone, so a long tool list sent
        again was reported uncached, and the same messages with other tools cached."""
        digest = hashlib.sha256()
        digest.update(_canonical(list(tools)))
        digest.update(b"\x1d")  # the tools' end: a prompt without tools is not one with them
        tokens = tool_tokens
        found = 0
        remembered: list[tuple[str, str]] = []
        for message in messages:
            # Digests, not the prompts: 10,000 prompts of up to 32 MiB each were kept whole.
            digest.update(_canonical(message))
            digest.update(b"\x1e")  # a message's end: two messages are not one
            tokens += message_tokens(message)
            if tokens < min_tokens:
                continue
            key = (model, digest.copy().hexdigest())
            if key in self.seen:
                self.seen.move_to_end(key)
                found = tokens
            else:
                remembered.append(key)
        for key in remembered:
            self.seen[key] = None
            if len(self.seen) > PROMPTS_CACHED:
                self.seen.popitem(last=False)
        return found // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS


def _canonical(message: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """A message (or the tools) as bytes that two equal ones share (keys sorted)."""
    text = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
    return text.encode("utf-8", "surrogatepass")
