"""What a caller of ``TaskClassifier`` asked for (``ClassifyRequest``), and the command ids a
keyed classify or reclassify saves under (``CallCommand``): which callers share one model call,
and how a retry under a key finds the call it made."""

from __future__ import annotations

from dataclasses import dataclass

from flowledger.domain.errors import TaskIdempotencyKeyReused
from flowledger.infrastructure.engine.task_keys import KeyedCommand, call_command_id


@dataclass(frozen=True)
class ClassifyRequest:
    """What a caller asked for: ``classify`` (``again`` false) or ``reclassify``, on ``model``,
    under the caller's idempotency ``key`` (None: none given)."""

    model: str | None
    again: bool
    key: str | None = None

    def shares(self, leading: ClassifyRequest, *, answered: bool) -> bool:
        """Whether this waiting caller takes the outcome of ``leading``'s call as its own.

        A classify takes any answered call's task (classified now, or waiting after its
        failures were recorded: a classify would return it unchanged, or pay to fail again)
        and a classify's error. A reclassify takes only another reclassify on the same model:
        after any other it makes its call of its own.
        """
        if self.again:
            return leading == self
        return answered or not leading.again

    @property
    def purpose(self) -> str:
        """The purpose of the task's lock across engines: one for classify, one per model for
        reclassify (the callers that would share one call in one engine wait for each other)."""
        return f"reclassify\x1f{self.model or ''}" if self.again else "classify"


@dataclass(frozen=True)
class CallCommand:
    """A caller's key for a classify or reclassify, as the command ids its saves carry:
    ``task-call␟<classify|reclassify>␟<model>␟<key>␟<primary|fallback>``. The events a call
    wrote under a key answer a retry with it (no second call); a key that names another kind
    or model is refused (``TaskIdempotencyKeyReused``), nothing recorded."""

    kind: str
    model: str
    key: str

    @classmethod
    def of(cls, request: ClassifyRequest) -> CallCommand | None:
        if request.key is None:
            return None
        return cls("reclassify" if request.again else "classify", request.model or "", request.key)

    def id(self, *, primary: bool) -> str:
        return call_command_id(self.kind, self.model, self.key, primary=primary)

    def answered(self, task_id: str, command_ids: list[str | None]) -> bool:
        """Whether the task's events hold this command's outcome (TaskIdempotencyKeyReused when
        the key names another request)."""
        for command_id in command_ids:
            keyed = KeyedCommand.read(command_id)
            if keyed is None or keyed.key != self.key:
                continue
            if not keyed.call:  # a release's or requeue's (task_keys.py)
                raise TaskIdempotencyKeyReused(task_id, self.key, f"a {keyed.kind}")
            if (keyed.kind, keyed.model) == (self.kind, self.model):
                return True
            named = f"a {keyed.kind}" + (f" on {keyed.model}" if keyed.model else " on the routed model")
            raise TaskIdempotencyKeyReused(task_id, self.key, named)
        return False
