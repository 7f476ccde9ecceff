"""Plain, immutable views of a session that the engine hands to callers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from flowledger.domain.values import JsonObject, LlmUsage


class SessionStatus(StrEnum):
    """Where a session stands in its life."""

    ACTIVE = "active"
    COMPLETED = "completed"
    EXPIRED = "expired"
    ABANDONED = "abandoned"


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One processed step, as recorded by a StepProcessed event."""

    step: str
    input: JsonObject
    output: JsonObject
    next_step: str | None
    context_update: JsonObject | None
    usage: LlmUsage | None
    idempotency_key: str | None
    version: int
    recorded_at: datetime

    @classmethod
    def of(cls, processed: Any) -> StepRecord:
        """The record a StepProcessed event makes."""
        return cls(
            step=processed.step,
            input=processed.input,
            output=processed.output,
            next_step=processed.next_step,
            context_update=processed.context_update,
            usage=processed.usage,
            idempotency_key=processed.idempotency_key,
            version=processed.originator_version,
            recorded_at=processed.timestamp,
        )


@dataclass(frozen=True, kw_only=True)
class StepFailure:
    """One failed step, as recorded by a StepFailed event."""

    step: str
    error_type: str
    error_message: str
    usage: LlmUsage | None
    idempotency_key: str | None
    version: int
    recorded_at: datetime

    @classmethod
    def of(cls, failed: Any) -> StepFailure:
        """The failure a StepFailed event makes."""
        return cls(
            step=failed.step,
            error_type=failed.error_type,
            error_message=failed.error_message,
            usage=failed.usage,
            idempotency_key=failed.idempotency_key,
            version=failed.originator_version,
            recorded_at=failed.timestamp,
        )


@dataclass(frozen=True, kw_only=True)
class PendingStep:
    """A step whose StepStarted has no outcome yet (in flight, or its worker crashed)."""

    step: str
    input: JsonObject
    model: str | None
    idempotency_key: str
    started_at: datetime

    @classmethod
    def of(cls, started: Any) -> PendingStep:
        """The pending step a StepStarted event makes."""
        return cls(
            step=started.step,
            input=started.input,
            model=started.model,
            idempotency_key=started.idempotency_key,
            started_at=started.started_at,
        )


@dataclass(frozen=True, kw_only=True)
class Totals:
    """Usage summed over every recorded step (processed and failed)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")

    def add(self, usage: LlmUsage | None) -> Totals:
        """These totals with one more call's usage added."""
        if usage is None:
            return self
        return Totals(
            calls=self.calls + 1,
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + usage.cache_read_input_tokens,
            reasoning_output_tokens=self.reasoning_output_tokens + usage.reasoning_output_tokens,
            cost_usd=self.cost_usd + usage.cost_usd,
        )


@dataclass(frozen=True, kw_only=True)
class SessionState:
    """A session as it stands at one version."""

    session_id: str
    tenant: str
    workflow: str
    user_id: str | None
    status: SessionStatus
    current_step: str
    context: JsonObject
    metadata: JsonObject
    history: tuple[StepRecord, ...]
    failures: tuple[StepFailure, ...]
    pending: tuple[PendingStep, ...]
    totals: Totals
    resolution: JsonObject | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    version: int

    @property
    def step_count(self) -> int:
        """How many steps were processed."""
        return len(self.history)
