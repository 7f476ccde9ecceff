"""What a classification changes about a waiting task's routing, as its Classified event records it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from flowledger.domain.bounds import storable
from flowledger.domain.skills import Derivation


@dataclass(frozen=True, kw_only=True)
class RoutingChange:
    """The routing fields of a Classified event: None leaves the task's skills, priority or
    deadline as they are; ``derivation`` gives the reasons ('' when nothing was derived)."""

    required_skills: tuple[str, ...] | None = None
    priority: str | None = None
    deadline: datetime | None = None
    derivation: str = ""


_NOT_APPLIED = "not applied, an agent holds the task (a classification routes a task only while it waits)"


def was_not_applied(derivation: str) -> bool:
    """Whether a Classified event's ``derivation`` says it derived something that was not applied
    because an agent held the task: what it derives is applied once the task waits again."""
    return derivation.startswith(_NOT_APPLIED)


def routing_change(
    derivation: Derivation | None, *, waiting: bool, priority: str, creator_priority: str, complexity: str
) -> RoutingChange:
    """What ``derivation`` (the skill catalogue's, for a classification of ``complexity``)
    changes for a task whose current priority is ``priority``: nothing unless the task waits
    (the reasons are kept, saying they were not applied: an empty derivation left a history
    unable to tell why a reclassification of an assigned task raised nothing). A priority an
    earlier classification raised goes back to the creator's when this one raises none, and
    the reasons say so."""
    if derivation is None:
        return RoutingChange()
    if not waiting:
        if not derivation.reason:
            return RoutingChange()
        return RoutingChange(derivation=storable(f"{_NOT_APPLIED}: {derivation.reason}", 2000))
    raised = derivation.priority.value if derivation.priority is not None else None
    if raised is None and priority != creator_priority:
        # An earlier classification raised it and this one raises nothing: the raise it
        # stood on is replaced, so the creator's priority applies again.
        raised = creator_priority
        derivation = replace(
            derivation,
            reasons=(
                *derivation.reasons,
                f"priority back to {creator_priority} as created ({complexity} complexity raises none)",
            ),
        )
    return RoutingChange(
        required_skills=derivation.required_skills,
        priority=raised,
        deadline=derivation.deadline,
        derivation=storable(derivation.reason, 2000),
    )
