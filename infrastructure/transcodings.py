"""JSON transcodings for flowledger's value objects.

Every reader of the event log (engine, projections, audit) must register the
same transcodings, or reads fail: use ``register_transcodings``.

Decoding is tolerant of what a newer release may write: keys a value object does not
know are ignored (a newer writer added a field), and fields it lacks take their defaults.
So adding a field with a default to a value object never needs an upcaster, and an old
reader still loads the streams a newer one wrote. Removing or renaming a field does.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from eventsourcing.persistence import JSONTranscoder, Transcoding

from flowledger.domain.session_views import PendingStep, StepFailure, StepRecord, Totals
from flowledger.domain.task_views import Assignment, Classification, Escalation
from flowledger.domain.values import LlmUsage


class DataclassAsDict(Transcoding):
    """Encodes a dataclass as a dict of its fields, under a stable name."""

    def __init__(self, cls: type[Any], name: str) -> None:
        self.type = cls
        self.name = name
        self._names = tuple(f.name for f in fields(cls))
        self._known = frozenset(self._names)

    def encode(self, obj: Any) -> dict[str, Any]:
        """The fields as a dict (nested values are transcoded in turn)."""
        return {name: getattr(obj, name) for name in self._names}

    def decode(self, data: dict[str, Any]) -> Any:
        """The dataclass again; keys it does not know (written by a newer release) are ignored."""
        if not self._known.issuperset(data):
            data = {name: value for name, value in data.items() if name in self._known}
        return self.type(**data)


# Names are stored with every event: never change one, only add.
TRANSCODINGS: tuple[Transcoding, ...] = (
    DataclassAsDict(LlmUsage, "flowledger.LlmUsage"),
    DataclassAsDict(StepRecord, "flowledger.StepRecord"),
    DataclassAsDict(StepFailure, "flowledger.StepFailure"),
    DataclassAsDict(PendingStep, "flowledger.PendingStep"),
    DataclassAsDict(Totals, "flowledger.Totals"),
    DataclassAsDict(Classification, "flowledger.TaskClassification"),
    DataclassAsDict(Assignment, "flowledger.TaskAssignment"),
    DataclassAsDict(Escalation, "flowledger.TaskEscalation"),
)


def register_transcodings(transcoder: JSONTranscoder) -> None:
    """Register flowledger's transcodings on a library transcoder."""
    for transcoding in TRANSCODINGS:
        transcoder.register(transcoding)
