"""A caller's idempotency key for a task's release or requeue, as the command id its events carry.

A release or requeue is decided on the task's status, which moves on: a retry sent after a
queue run had assigned the task again released the new assignment. Under a key the command's
events carry ``task-cmd␟<release|requeue>␟<key>``, so its retry finds them in the task's log and
is answered with the task as the first send left it, whatever happened since.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowledger.domain.aggregate import command_id_of
from flowledger.domain.bounds import require_name
from flowledger.domain.errors import TaskIdempotencyKeyReused
from flowledger.domain.task import Task

_CMD = "task-cmd"
_CALL = "task-call"  # a classify's or reclassify's (``classification._Command``)
_SEP = "\x1f"  # never in a name (``require_name``), so never in a key


@dataclass(frozen=True)
class TaskCommandKey:
    """A caller's key for one ``kind`` of task command (``release`` or ``requeue``), with what
    it asked (``asked``: the words a retry must repeat, as ``described`` gives them)."""

    kind: str
    key: str
    asked: str

    @classmethod
    def of(cls, kind: str, key: str | None, asked: str) -> TaskCommandKey | None:
        """The key a caller gave, checked (ValidationError naming ``idempotency_key``), or None."""
        if key is None:
            return None
        return cls(kind, require_name("idempotency_key", key), asked)

    @property
    def command_id(self) -> str:
        """The command id of the events this command saves."""
        return _SEP.join((_CMD, self.kind, self.key))

    def first_version(self, task_id: str, stored: Iterable[Any]) -> int | None:
        """The task's version after the first send of this command (None: never sent). The key
        naming another command of the task is TaskIdempotencyKeyReused."""
        for event in stored:
            parts = (command_id_of(event) or "").split(_SEP)
            if parts[0] == _CALL and len(parts) == 5 and parts[3] == self.key:
                raise TaskIdempotencyKeyReused(task_id, self.key, f"a {parts[1]}")
            if parts[0] != _CMD or len(parts) != 3 or parts[2] != self.key:
                continue
            recorded = described(event)
            if parts[1] != self.kind or recorded != self.asked:
                raise TaskIdempotencyKeyReused(task_id, self.key, recorded or f"a {parts[1]}")
            version: int = event.originator_version
            return version
        return None


def described(event: Any) -> str:
    """How a release or requeue event names the request it recorded (a key's retry repeats it)."""
    if isinstance(event, Task.Released):
        return release_words(event.reason)
    if isinstance(event, Task.Requeued):
        return requeue_words(event.requested_by, event.reason)
    return ""


def release_words(reason: str) -> str:
    """A release as a key records it."""
    return f"a release for {reason!r}"


def requeue_words(requested_by: str, reason: str) -> str:
    """A requeue as a key records it (its deadline, given as a delay, moves with each send)."""
    return f"a requeue by {requested_by!r} for {reason!r}"
