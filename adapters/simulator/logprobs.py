"""Log probabilities: ``logprobs: true`` is answered with one for each token of the reply (and
``top_logprobs`` alternatives to each), shaped as OpenAI's.

The simulator answered ``"logprobs": null`` whatever was asked, so a client written against
OpenAI that read ``choice.logprobs.content`` failed on every reply with an ``AttributeError``.
A token here is four characters, as ``replies.count_tokens`` counts them, so a reply has as
many as its completion tokens; the figures are drawn, the alternatives made up.
"""

from __future__ import annotations

import random
from typing import Any

TOKEN_CHARS = 4
"""Characters in a token, as ``replies.count_tokens`` counts them."""


def token_logprobs(text: str, top: int, rng: random.Random) -> list[dict[str, Any]]:
    """An entry for each token of ``text``: the token, its bytes and a log probability of at
    most 0, and ``top`` alternatives, the token itself first, each less likely than the last."""
    entries = []
    for start in range(0, len(text), TOKEN_CHARS):
        token = text[start : start + TOKEN_CHARS]
        chosen = -round(rng.uniform(0.0, 0.7), 6)
        alternatives = [_entry(token, chosen)] + [
            _entry(f"{token}{rank}", round(chosen - 1.5 * rank, 6)) for rank in range(1, top)
        ]
        entries.append({**_entry(token, chosen), "top_logprobs": alternatives[:top]})
    return entries


def choice_logprobs(content: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A choice's (or a streamed delta's) ``logprobs`` for the token entries ``content`` (None
    for a tool call's, which has no content)."""
    return {"content": content, "refusal": None}


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "surrogatepass"))}
