"""What ``POST /webhook/workflow-state`` answers with 200, for the API document only: the handler
writes its plain JSON itself (no validation walk per step), and these models say its shape, so
clients and generated tests can check an answer (``tests/e2e/test_http_fuzz.py`` does)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class CreatedSession(BaseModel):
    """``create_session``: the session (in the seed's mode also whether it was made or restarted)."""

    id: str = Field(description="The session's aggregate id (a UUID).")
    session_id: str
    current_step: str | None
    expires_at: str = Field(description="RFC 3339.")
    created: bool | None = Field(default=None, description="The seed's mode: a new session.")
    restarted: bool | None = Field(default=None, description="The seed's mode: taken back to init.")
    reopened: bool | None = Field(default=None, description="The seed's mode: it had expired.")


class StepMetrics(BaseModel):
    """What the step's model call cost (every billed attempt, as totals and budgets count it)."""

    model: str | None
    tokens: int = Field(description="Input plus output tokens of every attempt cost_usd counts.")
    cost_usd: float
    latency_ms: int
    unpriced: bool | None = Field(default=None, description="True when cost_usd is only the known part.")


class ProcessedStep(BaseModel):
    """``process_step``: the model's decision and what it cost."""

    session_id: str
    step: str
    next_step: str | None
    action: Any = Field(description="The model's action (its JSON as given).")
    message: Any = Field(description="The model's message (a refusal's words when it refused).")
    context: dict[str, Any]
    ai_metrics: StepMetrics
    problems: list[str] | None = Field(
        default=None, description="Present only when the reply is not the whole decision (cut, refused)."
    )


class ExtendedSession(BaseModel):
    """``extend_session``: the new expiry and the one before it."""

    session_id: str
    expires_at: str
    previous_expires_at: str
    reopened: bool
    message: str


class HistoryEntry(BaseModel):
    """One step of ``get_state``'s history, in the seed's fields."""

    step: str
    timestamp: str
    ai_cost: float
    unpriced: bool | None = None


class SessionState(BaseModel):
    """``get_state``: the session's context, step and history (all null/empty when unknown)."""

    context: dict[str, Any] | None
    current_step: str | None
    history: list[HistoryEntry]


class UnknownAction(BaseModel):
    """The seed's mode's answer to an action it does not know (strict mode answers 400)."""

    error: str


class WebhookAnswer(BaseModel):
    """The seed's envelope: ``{"success": true, "data": ...}``, ``data`` by action."""

    success: Literal[True]
    data: CreatedSession | ProcessedStep | ExtendedSession | SessionState | UnknownAction
