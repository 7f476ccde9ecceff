"""A caller's idempotency key for a task's release or requeue, as the command id its events carry,
and the one reading of every task command id made under a caller's key.

A release or requeue is decided on the task's status, which moves on: a retry sent after a
queue run had assigned the task again released the new assignment. Under a key the command's
events carry ``task-cmd␟<release|requeue>␟<key>``, so its retry finds them in the task's log and
is answered with the task as the first send left it, whatever happened since. A classify's or
reclassify's saves carry ``task-call␟<kind>␟<model>␟<key>␟<primary|fallback>``
(``classification_requests.CallCommand``); each kind of command refuses a key the other used, so both
read the task's command ids through ``KeyedCommand.read``. A requeue sent without a key is
told from its retry by what it asked (``AskedRequeue``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flowledger.domain.aggregate import command_id_of
from flowledger.domain.bounds import require_name, shown
from flowledger.domain.errors import TaskIdempotencyKeyReused
from flowledger.domain.task import Task

_CMD = "task-cmd"
_CALL = "task-call"  # a classify's or reclassify's (``classification_requests.CallCommand``)
_SEP = "\x1f"  # never in a name (``require_name``), so never in a key or a model


@dataclass(frozen=True)
class KeyedCommand:
    """A task command id made under a caller's key, read back: a release's or requeue's
    (``call`` false, ``model`` empty) or a classify's or reclassify's (``call`` true; ``model``
    empty for the routed model)."""

    call: bool
    kind: str
    model: str
    key: str

    @classmethod
    def read(cls, command_id: str | None) -> KeyedCommand | None:
        """The keyed command ``command_id`` names (None: none, or not one made under a key)."""
        parts = (command_id or "").split(_SEP)
        if len(parts) == 3 and parts[0] == _CMD:
            return cls(call=False, kind=parts[1], model="", key=parts[2])
        if len(parts) == 5 and parts[0] == _CALL:
            return cls(call=True, kind=parts[1], model=parts[2], key=parts[3])
        return None


def call_command_id(kind: str, model: str, key: str, *, primary: bool) -> str:
    """The command id of a classify's or reclassify's save under ``key`` (``KeyedCommand.read``)."""
    return _SEP.join((_CALL, kind, model, key, "primary" if primary else "fallback"))


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
        version: int | None = None
        for event in stored:
            keyed = KeyedCommand.read(command_id_of(event))
            if keyed is None or keyed.key != self.key:
                if version is not None:
                    return version
                continue
            if version is not None:
                # The same save's later events (a classification its release applied): the
                # first send's answer was the task after all of them.
                version = event.originator_version
                continue
            if keyed.call:
                raise TaskIdempotencyKeyReused(task_id, self.key, f"a {keyed.kind}")
            recorded = described(event)
            if keyed.kind != self.kind or recorded != self.asked:
                raise TaskIdempotencyKeyReused(task_id, self.key, recorded or f"a {keyed.kind}")
            version = event.originator_version
        return version


COST_ONLY = (Task.ClassificationDiscarded, Task.RankingDiscarded)
"""Events kept for a paid call's cost that change nothing about the task."""


def last_changes(read: Callable[[int], list[Any]], version: int, count: int = 2) -> list[Any]:
    """The task's last ``count`` events that changed it (fewer in a shorter log), looking past
    those kept only for a call's cost (``COST_ONLY``); ``read(gt)`` gives its events after
    version ``gt``. A release retried after a ranking call was recorded on the waiting task
    found the ``RankingDiscarded`` last and was refused ("it is pending")."""
    window = count
    while True:
        events = [e for e in read(max(version - window, 0)) if not isinstance(e, COST_ONLY)]
        if len(events) >= count or window >= version:
            return events[-count:]
        window *= 4


def last_command(events: list[Any]) -> list[Any]:
    """The trailing ``events`` that one command recorded (one save: they share its command id)."""
    if not events:
        return []
    command = command_id_of(events[-1])
    if command is None:  # an event stored before command ids: its own save, as far as is known
        return events[-1:]
    start = len(events)
    while start > 0 and command_id_of(events[start - 1]) == command:
        start -= 1
    return events[start:]


def described(event: Any) -> str:
    """How a release or requeue event names the request it recorded (a key's retry repeats it)."""
    if isinstance(event, Task.Released):
        return release_words(event.reason)
    if isinstance(event, Task.Requeued):
        return requeue_words(event.requested_by, event.reason)
    return ""


def release_words(reason: str) -> str:
    """A release as a key records it."""
    return f"a release for {shown(reason)}"


def requeue_words(requested_by: str, reason: str) -> str:
    """A requeue as a key records it (its deadline, given as a delay, moves with each send)."""
    return f"a requeue by {shown(requested_by)} for {shown(reason)}"


@dataclass(frozen=True)
class AskedRequeue:
    """A requeue as asked: who, why, and the new deadline (``exact``: given as a moment), for
    telling its retry (with no key) from another requeue."""

    requested_by: str
    reason: str
    deadline: datetime | None
    exact: bool

    def matches(self, event: Task.Requeued) -> bool:
        """Whether ``event`` records this requeue: the same person and reason, and the same
        deadline (any, for one given as a delay; none, for none)."""
        if (event.requested_by, event.reason) != (self.requested_by, self.reason):
            return False
        if self.deadline is None or event.deadline is None:
            return self.deadline is event.deadline
        return not self.exact or event.deadline == self.deadline
