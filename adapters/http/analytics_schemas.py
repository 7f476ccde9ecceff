"""What the analytics routes answer, for ``/openapi.json``: ``GET /v1/dashboard``'s rows and
``GET /v1/funnel/{workflow}``'s reports, as ``dataclasses.asdict`` of the projections' rows writes them.

Documentation only (the routes answer their dicts as before); ``tests/e2e/test_http_dashboard.py``
holds the answers to these shapes, unknown fields refused, so the document cannot drift.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from flowledger.adapters.http.task_schemas import Described


class DashboardRowOut(Described):
    group: list[Any] = Field(
        description="The group's values, in the order of `by` (a bucket as a time); null for "
        "calls that recorded none (no model, provider or session); by step, a task's calls are "
        '{"task_step": name}, apart from a session step of that name'
    )
    calls: int
    errors: int
    errors_by_type: dict[str, int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    cost_usd: str = Field(description="Everything billed, exact (a decimal string)")
    latency_avg_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    succeeded_cost_usd: str
    retried_cost_usd: str
    failed_cost_usd: str
    unpriced_calls: int = Field(description="Calls with no known cost: cost_usd leaves them out")
    cache_creation_tokens: int
    audio_input_tokens: int = Field(default=0, description="The audio part of input_tokens")
    audio_output_tokens: int = Field(default=0, description="The audio part of output_tokens")
    reprice_as: str | None = Field(default=None, description="With reprice_as: the model priced at")
    priced_calls: int | None = Field(default=None, description="With reprice_as: the calls it could price")
    recorded_cost_usd: str | None = Field(
        default=None,
        description="With reprice_as: what the priced calls' answers were recorded to cost (their"
        " tokens are what is repriced; cost_usd also counts retried attempts and calls it could not price)",
    )
    repriced_cost_usd: str | None = Field(
        default=None, description="With reprice_as: their cost at its prices"
    )
    difference_usd: str | None = Field(
        default=None, description="With reprice_as: repriced_cost_usd minus recorded_cost_usd"
    )


class FunnelStepOut(Described):
    step: str
    reached: int
    processed: int
    overall_conversion: float
    step_conversion: float
    dropped: dict[str, int] = Field(description="Sessions that stopped here, by cause")
    failed_by_error: dict[str, int]
    in_progress: int
    completed: int
    p50_seconds: float | None = Field(description="Time to reach the step from the session's start")
    p95_seconds: float | None


class FunnelReportOut(Described):
    workflow: str
    segment: str | None
    sessions: int
    before_first_step: dict[str, int]
    steps: list[FunnelStepOut]
