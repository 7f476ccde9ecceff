"""Synthetic session histories with chosen timestamps, appended through the recorder in bulk.

For benchmarks and tests: events are built as the Session aggregate would record them, but
with the caller's clock, and stored many per transaction instead of one command at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.utils import get_topic

from flowledger.domain.session import Session, session_uuid
from flowledger.domain.values import JsonObject, LlmUsage
from flowledger.infrastructure.engine.log import EventLog


@dataclass
class SessionScript:
    """The events of one session, written in order; each method appends one event."""

    session_id: str
    workflow: str
    at: datetime
    tenant: str = "default"
    user_id: str | None = None
    metadata: JsonObject = field(default_factory=dict)
    ttl: timedelta = timedelta(hours=24)
    events: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.id: UUID = session_uuid(self.tenant, self.session_id)
        started: Any = Session.Started  # its fields come from the library's metaclass
        self.events.append(
            started(
                originator_topic=get_topic(Session),
                originator_id=self.id,
                originator_version=1,
                timestamp=self.at,
                session_id=self.session_id,
                tenant=self.tenant,
                workflow=self.workflow,
                user_id=self.user_id,
                expires_at=self.at + self.ttl,
                metadata=self.metadata,
            )
        )

    def _add(self, cls: type[Any], at: datetime, **fields: Any) -> SessionScript:
        version = len(self.events) + 1
        self.events.append(cls(originator_id=self.id, originator_version=version, timestamp=at, **fields))
        return self

    def start_step(self, step: str, at: datetime, *, model: str | None = None) -> SessionScript:
        """StepStarted (keyed by the step and version)."""
        key = f"{step}-{len(self.events) + 1}"
        return self._add(
            Session.StepStarted,
            at,
            step=step,
            input={},
            model=model,
            idempotency_key=key,
            started_at=at,
            lease_until=at + timedelta(seconds=15),
            worker="synthetic",
        )

    def step(
        self,
        step: str,
        at: datetime,
        *,
        usage: LlmUsage | None = None,
        next_step: str | None = None,
        context_update: JsonObject | None = None,
        input: JsonObject | None = None,
        output: JsonObject | None = None,
    ) -> SessionScript:
        """StepProcessed."""
        return self._add(
            Session.StepProcessed,
            at,
            step=step,
            input=input or {},
            output=output or {},
            next_step=next_step,
            context_update=context_update,
            usage=usage,
            idempotency_key=None,
            model=None,
        )

    def fail(
        self,
        step: str,
        at: datetime,
        error_type: str,
        *,
        usage: LlmUsage | None = None,
        message: str = "failed",
    ) -> SessionScript:
        """StepFailed."""
        return self._add(
            Session.StepFailed,
            at,
            step=step,
            error_type=error_type,
            error_message=message,
            usage=usage,
            idempotency_key=None,
            error_detail=None,
        )

    def update_context(self, at: datetime, update: JsonObject) -> SessionScript:
        """ContextUpdated."""
        return self._add(Session.ContextUpdated, at, update=update)

    def extend(self, at: datetime, ttl: timedelta) -> SessionScript:
        """Extended to ``at + ttl``."""
        return self._add(Session.Extended, at, expires_at=at + ttl)

    def complete(self, at: datetime, resolution: str = "done") -> SessionScript:
        """Completed."""
        return self._add(Session.Completed, at, resolution={"resolution": resolution})

    def expire(self, at: datetime) -> SessionScript:
        """Expired."""
        return self._add(Session.Expired, at, expired_at=at)

    def restart(self, at: datetime, expires_at: datetime, user_id: str | None = None) -> SessionScript:
        """Restarted (a repeated ``create_session``)."""
        return self._add(Session.Restarted, at, expires_at=expires_at, user_id=user_id)

    def reopen(self, at: datetime, ttl: timedelta) -> SessionScript:
        """Reopened until ``at + ttl``."""
        return self._add(Session.Reopened, at, expires_at=at + ttl)

    def abandon(self, at: datetime, reason: str = "abandoned") -> SessionScript:
        """Abandoned."""
        return self._add(Session.Abandoned, at, reason=reason)


def interleave(scripts: Sequence[SessionScript]) -> list[Any]:
    """All the scripts' events in timestamp order (ties keep each session's order)."""
    tagged = [(e.timestamp, i, j, e) for i, s in enumerate(scripts) for j, e in enumerate(s.events)]
    return [e for *_, e in sorted(tagged, key=lambda t: t[:3])]


def chunks(events: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``events`` in lists of at most ``size``."""
    chunk: list[Any] = []
    for event in events:
        chunk.append(event)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def append(log: EventLog, events: Iterable[Any], *, per_transaction: int = 5000) -> int:
    """Encode and store ``events`` through an engine's log, many per transaction."""
    stored = 0
    for chunk in chunks(events, per_transaction):
        log.append(chunk)
        stored += len(chunk)
    return stored
