"""Ports: what the domain core needs from the outside world, as protocols.

The LLM adapter (``flowledger.adapters.llm``) implements ``LlmPort``; the Engine is
given one at construction and never imports the adapter itself. This module also
holds the step-reply contract: the prompt that asks a model for a JSON step decision
and the parser that reads the reply (a non-JSON reply falls back to a message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from flowledger.domain.values import JsonObject, LlmUsage

STEP_REPLY_KEYS = ("action", "context_update", "next_step", "message")


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
        """Return the reply, or raise an ``LlmError`` (a FlowledgerError) carrying usage so far."""
        ...


@dataclass(frozen=True, kw_only=True)
class StepReply:
    """A model's decision for one workflow step, read from its reply.

    ``structured`` is False when the reply was not a JSON object: the whole text
    becomes ``message`` and nothing else is taken from it. ``problems`` lists fields
    that were present but unusable (and therefore dropped).
    """

    action: str | None
    context_update: JsonObject | None
    next_step: str | None
    message: str
    structured: bool
    problems: tuple[str, ...] = ()

    def output(self) -> JsonObject:
        """The step's recorded output: the decision plus how it was read."""
        return {
            "action": self.action,
            "message": self.message,
            "reply_format": "json" if self.structured else "text",
            "problems": list(self.problems),
        }


def parse_step_reply(content: str) -> StepReply:
    """Read ``action``, ``context_update``, ``next_step`` and ``message`` from a model reply.

    Models often wrap JSON in a Markdown fence; that is accepted. Anything that is not
    a JSON object falls back to a plain message, flagged ``structured=False``.
    """
    data = _json_object(content)
    if data is None:
        return StepReply(action=None, context_update=None, next_step=None, message=content, structured=False)
    problems: list[str] = []
    action = _optional_text(data.get("action"), "action", problems, limit=200)
    next_step = _optional_text(data.get("next_step"), "next_step", problems, limit=200)
    message = _optional_text(data.get("message"), "message", problems, limit=None) or ""
    update = data.get("context_update")
    if update is not None and not _plain_json_object(update):
        problems.append("context_update is not a plain JSON object")
        update = None
    return StepReply(
        action=action,
        context_update=update or None,
        next_step=next_step,
        message=message,
        structured=True,
        problems=tuple(problems),
    )


def step_messages(
    *, step: str, previous_step: str, context: JsonObject, input: JsonObject
) -> list[dict[str, Any]]:
    """The chat messages that ask a model to decide one step, as a JSON object."""
    merged = {**context, **input}
    system = (
        "You process one step of a stateful workflow.\n"
        f"Current step: {step}\nPrevious step: {previous_step}\n"
        "Decide what action to take next, what to store in the session context, and "
        "which step comes next. Reply with a JSON object with the keys "
        '"action" (string), "context_update" (object), "next_step" (string or null) '
        'and "message" (string, for the user).'
    )
    user = json.dumps(merged, ensure_ascii=False, sort_keys=True, default=str)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _json_object(content: str) -> dict[str, Any] | None:
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").strip()
        if text.startswith("json"):
            text = text[4:]
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _plain_json_object(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _optional_text(value: Any, name: str, problems: list[str], *, limit: int | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{name} is not a non-empty string")
        return None
    if limit is not None and len(value) > limit:
        problems.append(f"{name} is longer than {limit} characters")
        return None
    return value
