"""JSON transcodings for flowledger's value objects.

Every reader of the event log (engine, projections, audit) must register the
same transcodings, or reads fail: use ``register_transcodings``.
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

    def encode(self, obj: Any) -> dict[str, Any]:
        """The fields as a dict (nested values are transcoded in turn)."""
        return {name: getattr(obj, name) for name in self._names}

    def decode(self, data: dict[str, Any]) -> Any:
        """The dataclass again."""
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
