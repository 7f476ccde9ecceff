"""Every prompt flowledger sends and the parsers of the replies: one home for the model contract.

Three conversations: deciding a workflow step (``step_messages`` / ``parse_step_reply``),
classifying a task (``classification_messages`` / ``parse_classification_reply``) and
picking one of several equally good agents for a task (``ranking_messages`` /
``parse_ranking_reply``, routing's ``model_ranked_matching``). Pure: the LLM adapter sends
the messages; the engine records what the parsers read. The LLM simulator recognises each
conversation by ``CLASSIFICATION_MARKER``, ``RANKING_MARKER`` and ``STEP_LINE``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowledger.domain.bounds import MAX_NAME_LENGTH, require_name, storable
from flowledger.domain.errors import ValidationError
from flowledger.domain.task_views import CATEGORIES, COMPLEXITIES, Classification
from flowledger.domain.values import JsonObject, LlmUsage

STEP_REPLY_KEYS = ("action", "context_update", "next_step", "message")
STEP_LINE = "Current step: "
"""Starts the line of the step prompt that names the step (the simulator reads it)."""

CLASSIFICATION_MARKER = "task classification engine"
"""In the classification prompt, and nowhere else (the simulator recognises it by this)."""

CLASSIFICATION_SYSTEM_PROMPT = (
    f"You are a {CLASSIFICATION_MARKER}. Reply with one JSON object and nothing else: "
    f'{{"category": one of {list(CATEGORIES)}, "complexity": one of {list(COMPLEXITIES)}, '
    '"estimated_hours": a positive number}.'
)


RANKING_MARKER = "agent matching engine"
"""In the ranking prompt, and nowhere else (the simulator recognises it by this)."""

RANKING_SYSTEM_PROMPT = (
    f"You are an {RANKING_MARKER}. The agents listed are equally eligible for the task: each "
    "covers its required skills and they are equally loaded. Pick the one whose skills fit the "
    'task best. Reply with one JSON object and nothing else: {"agent_id": one of the listed ids, '
    '"reason": one short sentence}.'
)

MAX_RANKING_REASON = 300
"""The longest model-given reason kept on the assignment."""


class ClassifiableTask(Protocol):
    """What the classification prompt needs of a task (``domain.task.Task`` has it)."""

    @property
    def description(self) -> str:
        """What the task is, in the requester's words."""
        ...

    @property
    def required_skills(self) -> Sequence[str]:
        """The skills the requester listed."""
        ...


def classification_messages(task: ClassifiableTask) -> list[dict[str, Any]]:
    """The chat messages that ask a model to classify ``task``."""
    skills = ", ".join(task.required_skills) or "none listed"
    return [
        {"role": "system", "content": CLASSIFICATION_SYSTEM_PROMPT},
        {"role": "user", "content": f"Classify this task: {task.description}\nRequired skills: {skills}"},
    ]


def parse_classification_reply(content: str, usage: LlmUsage | None) -> Classification:
    """Read a model's classification; raise ValidationError if it is not a valid one."""
    return Classification.from_reply(content, usage)


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


def parse_step_reply(
    content: str, *, finish_reasons: Collection[str] = (), refusal: str | None = None
) -> StepReply:
    """Read ``action``, ``context_update``, ``next_step`` and ``message`` from a model reply.

    Models often wrap JSON in a Markdown fence; that is accepted. Anything that is not
    a JSON object falls back to a plain message, flagged ``structured=False``. What the
    provider said of the answer is named in ``problems``: a ``refusal`` (its words become the
    message when there is no text), a reply cut at the token limit or by a content filter
    (``finish_reasons``), an answer with no text (a tool call). They were recorded as plain
    steps with an empty or broken message, the refusal's words dropped.
    """
    told = _told_problems(content, finish_reasons, refusal)
    if refusal and not content.strip():
        return StepReply(
            action=None, context_update=None, next_step=None, message=refusal, structured=False, problems=told
        )
    data = _json_object(content)
    if data is None:
        if not told and (why := _broken_object(content)) is not None:
            told = (f"the reply is a JSON object cut short or broken: {why}",)
        return StepReply(
            action=None, context_update=None, next_step=None, message=content, structured=False, problems=told
        )
    problems: list[str] = []
    action = _optional_text(data.get("action"), "action", problems, limit=200)
    next_step = _optional_name(data.get("next_step"), "next_step", problems)
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
        problems=(*told, *problems),
    )


_CUT_BY = {
    "length": "the reply was cut at the token limit (finish_reason: length)",
    "content_filter": (
        "the reply was withheld by the provider's content filter (finish_reason: content_filter)"
    ),
}
"""The finish reasons that say a reply is not the whole answer, and how a step names them."""


def _told_problems(content: str, finish_reasons: Collection[str], refusal: str | None) -> tuple[str, ...]:
    """What the provider said of the reply besides its text: a refusal, a cut, no text at all."""
    told = [_CUT_BY[reason] for reason in dict.fromkeys(finish_reasons) if reason in _CUT_BY]
    if refusal:
        told.insert(0, "the model refused to answer")
    elif not content.strip() and not told:
        others = [reason for reason in dict.fromkeys(finish_reasons) if reason != "stop"][:3]
        told.append("the reply has no text" + (f" (finish_reason: {', '.join(others)})" if others else ""))
    return tuple(told)


def step_messages(
    *, step: str, previous_step: str, context: JsonObject, input: JsonObject
) -> list[dict[str, Any]]:
    """The chat messages that ask a model to decide one step, as a JSON object."""
    merged = {**context, **input}
    system = (
        "You process one step of a stateful workflow.\n"
        f"{STEP_LINE}{step}\nPrevious step: {previous_step}\n"
        "Decide what action to take next, what to store in the session context, and "
        "which step comes next. Reply with a JSON object with the keys "
        '"action" (string), "context_update" (object), "next_step" (string or null) '
        'and "message" (string, for the user).'
    )
    user = json.dumps(merged, ensure_ascii=False, sort_keys=True, default=str)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def ranking_messages(
    task: ClassifiableTask, agents: Sequence[tuple[str, Sequence[str]]]
) -> list[dict[str, Any]]:
    """The chat messages that ask a model to pick one of ``agents`` (id, skills) for ``task``."""
    needs = ", ".join(task.required_skills) or "none listed"
    listed = "\n".join(f"- {agent}: {', '.join(skills) or 'no listed skills'}" for agent, skills in agents)
    return [
        {"role": "system", "content": RANKING_SYSTEM_PROMPT},
        {"role": "user", "content": f"Task: {task.description}\nRequired skills: {needs}\nAgents:\n{listed}"},
    ]


@dataclass(frozen=True, kw_only=True)
class RankingReply:
    """The agent a model picked, and why in its words."""

    agent_id: str
    reason: str


def parse_ranking_reply(content: str, agent_ids: Collection[str]) -> RankingReply:
    """Read a model's pick; ValidationError unless it names one of ``agent_ids``."""
    data = _json_object(content)
    if data is None:
        raise ValidationError("ranking", "the reply is not one JSON object")
    agent_id = data.get("agent_id")
    if not isinstance(agent_id, str) or agent_id not in agent_ids:
        raise ValidationError("ranking.agent_id", f"must be one of {sorted(agent_ids)}, got {agent_id!r}")
    reason = data.get("reason")
    given = reason.strip() if isinstance(reason, str) else ""
    return RankingReply(agent_id=agent_id, reason=storable(given, MAX_RANKING_REASON) or "no reason given")


def _unfenced(content: str) -> str:
    """``content`` without the Markdown fence models often wrap JSON in."""
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").strip()
        if text.startswith("json"):
            text = text[4:]
    return text


def _json_object(content: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_unfenced(content))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser (2 KB of brackets)
        return None
    return data if isinstance(data, dict) else None


def _broken_object(content: str) -> str | None:
    """Why a reply that begins as a JSON object does not read as one (the parser's words), or
    None: JSON cut short though the provider said it stopped (a proxy's early end) was recorded
    as a plain message, the broken JSON the user's, and no problem named."""
    text = _unfenced(content).lstrip()
    if not text.startswith("{"):
        return None
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return error.msg
    except ValueError:
        return "not JSON"
    except RecursionError:
        return "nested deeper than the parser reads"
    return None


def _plain_json_object(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _optional_name(value: Any, name: str, problems: list[str]) -> str | None:
    """``_optional_text`` held to the rule of a step's name (``require_name``): a next step with
    a control character (``"resolve\\r"``) or only a zero-width space passed the length check,
    and the session refused it after the call, so the paid answer failed the step (HTTP 502)."""
    text = _optional_text(value, name, problems, limit=MAX_NAME_LENGTH)
    if text is None:
        return None
    try:
        return require_name(name, text)
    except ValidationError as error:
        problems.append(f"{name} is not a step name: {error.message}")
        return None


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
