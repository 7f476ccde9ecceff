"""Which request parameters a model takes: OpenAI's reasoning models (o1, o3, o4-mini, gpt-5)
refuse ``max_tokens`` (they take ``max_completion_tokens``) and any temperature but their
default of 1, with a 400. One rule, read by the LLM client (what it sends) and by the
simulator (what it refuses, as OpenAI does).
"""

from __future__ import annotations

import re

_REASONING = re.compile(r"(o[1-9][0-9]*|gpt-5(\.[0-9]+)?)(-(?!chat)[a-z0-9.-]*)?")
"""o1, o3-mini, o4-mini-2025-04-16, gpt-5, gpt-5.1, gpt-5-mini; not gpt-5-chat-latest (a chat
model, which takes both), gpt-4o or a name that merely begins with o."""


def takes_completion_tokens_only(model: str) -> bool:
    """Whether ``model`` (a provider's prefix such as ``openai/`` set aside) is one of OpenAI's
    reasoning models: a token cap goes as ``max_completion_tokens`` and no temperature goes."""
    return _REASONING.fullmatch(model.rpartition("/")[2].lower()) is not None
