"""Cost dashboard fact table: one row per model call, with tokens, cost, latency and error type,
and its roll-ups per minute, hour and day (``cost_rollups``), kept in the same transaction.

A call's cost is the one its event recorded, unless a repricing (``projections/repricing``)
prices it anew; ``retried_cost_usd`` is what its retried attempts were billed, ``unpriced``
says its cost is not known (no price, or billed for tokens not reported: ``cost_usd`` is not
the call's cost, never a silent $0).

``subject_id`` is the caller's session id, or the task id for task calls (``source = 'task'``,
filed under the workflow ``tasks``; the dashboard's ``session`` and ``workflow`` groupings put
them under None, apart from any session's). A task call's ``task_priority`` is the priority the task
had when the call was made, the one that chose its tier's model (a classification may raise
the priority: the call that raised it was made at the one before); ``subjects`` keeps each
task's priority as the log has it so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import Cursor

from flowledger.domain.pricing import TOKEN_FIELDS
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.calls import require_summable
from flowledger.projections.catalog import Names
from flowledger.projections.cost_rollups import DDL as ROLLUP_DDL
from flowledger.projections.cost_rollups import add_calls_to_rollups
from flowledger.projections.repricing import RepricingCache, call_cost
from flowledger.projections.sql import Column, q, write_rows

TASK_WORKFLOW = "tasks"
"""The workflow name under which task classification calls are filed."""

SUBJECT_COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("subject_id", "text"),
    ("workflow", "text"),
    ("tenant", "text"),
    ("priority", "text"),
)
CALL_COLUMNS: tuple[Column, ...] = (
    ("id", "bigint"),
    ("source", "text"),
    ("originator_id", "uuid"),
    ("originator_version", "integer"),
    ("subject_id", "text"),
    ("workflow", "text"),
    ("step", "text"),
    ("error_type", "text"),
    ("provider", "text"),
    ("request_model", "text"),
    ("response_model", "text"),
    ("model", "text"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cache_read_input_tokens", "bigint"),
    ("reasoning_output_tokens", "bigint"),
    ("cost_usd", "numeric"),
    ("price_version", "text"),
    ("latency_ms", "double precision"),
    ("attempts", "integer"),
    ("occurred_at", "timestamptz"),
    ("tenant", "text"),
    ("cache_creation_input_tokens", "bigint"),
    ("cache_creation_1h_input_tokens", "bigint"),
    ("unpriced", "boolean"),
    ("cost_source", "text"),
    ("retried_cost_usd", "numeric"),
    ("task_priority", "text"),
    ("audio_input_tokens", "bigint"),
    ("audio_output_tokens", "bigint"),
)
RETRIED_COLUMNS: tuple[Column, ...] = tuple((f"retried_{name}", "bigint") for name in TOKEN_FIELDS)
"""The tokens a call's retried attempts were billed for (``LlmUsage.retried_tokens``), which its
``retried_cost_usd`` paid for: the dashboard adds them to the answer's, as a session's totals do.
The answer's own stay apart, as repricing prices them against its recorded cost."""
CALL_COLUMNS += RETRIED_COLUMNS

DDL = (
    """
CREATE TABLE {s}.subjects (
    originator_id uuid PRIMARY KEY,
    subject_id text NOT NULL,
    workflow text NOT NULL,
    tenant text NOT NULL,
    priority text
);
CREATE TABLE {s}.llm_calls (
    id bigint PRIMARY KEY,
    source text NOT NULL,
    originator_id uuid NOT NULL,
    originator_version integer NOT NULL,
    subject_id text,
    workflow text NOT NULL,
    step text NOT NULL,
    error_type text,
    provider text,
    request_model text,
    response_model text,
    model text,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_input_tokens bigint NOT NULL,
    reasoning_output_tokens bigint NOT NULL,
    cost_usd numeric NOT NULL,
    price_version text,
    latency_ms double precision,
    attempts integer,
    occurred_at timestamptz NOT NULL,
    tenant text,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_1h_input_tokens bigint NOT NULL DEFAULT 0,
    unpriced boolean NOT NULL DEFAULT false,
    cost_source text,
    retried_cost_usd numeric NOT NULL DEFAULT 0,
    task_priority text,
    audio_input_tokens bigint NOT NULL DEFAULT 0,
    audio_output_tokens bigint NOT NULL DEFAULT 0"""
    + "".join(f",\n    {name} bigint NOT NULL DEFAULT 0" for name, _ in RETRIED_COLUMNS)
    + """
);
CREATE INDEX ON {s}.llm_calls (tenant, occurred_at);
CREATE INDEX ON {s}.llm_calls (tenant, workflow, occurred_at);
"""
)


class CostDashboard(Projection):
    """Model calls with their usage, for cost and latency dashboards."""

    name = "cost"
    exposed = ("llm_calls", "cost_rollups")
    ddl = DDL + ROLLUP_DDL
    # 2: tenant on every row; 3: cache writes, unpriced, retried attempts; 4: cost_rollups;
    # 5: a task call's priority when it was made; 6: audio input and output tokens (priced apart);
    # 7: no latency for a call that sent no request or whose latency was never measured;
    # 8: the tokens of its retried attempts (``retried_*``, in llm_calls and the roll-ups);
    # 9: roll-up rows keyed by a hash of their names (``key_hash``)
    schema_version = 9
    # An archived session's v4 to v8 rows fit: task_priority is a task's (NULL), and a call
    # captured before the audio columns had no audio tokens read (0); one refused before any
    # request keeps the latency it was archived with; one captured before the retried attempts'
    # tokens were kept has none read (0), as it was archived.
    base_versions = (4, 5, 6, 7, 8)
    base_defaults = {
        "llm_calls": {
            "audio_input_tokens": 0,
            "audio_output_tokens": 0,
            **{name: 0 for name, _ in RETRIED_COLUMNS},
        }
    }

    def __init__(self) -> None:
        self._repricings = RepricingCache()

    handles = (
        Session.Started,
        Session.StepProcessed,
        Session.StepFailed,
        Task.Created,
        Task.Classified,
        Task.Escalated,
        Task.ClassificationDiscarded,
        Task.ClassificationFailed,
        Task.Assigned,
        Task.RankingDiscarded,
    )

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Insert a fact row for each call in the batch (and remember each subject's workflow
        and, for a task, its priority)."""
        # subject id, workflow, tenant, priority (a task's, as the events so far leave it)
        known: dict[UUID, list[Any]] = {}
        for envelope in batch:
            event = envelope.event
            if isinstance(event, Session.Started):
                known[event.originator_id] = [event.session_id, event.workflow, event.tenant, None]
            elif isinstance(event, Task.Created):
                known[event.originator_id] = [event.task_id, TASK_WORKFLOW, event.tenant, event.priority]
        created = list(known)
        calls = [(e, e.call) for e in batch if e.call is not None]
        reprioritised = {e.event.originator_id for e in batch if _priority_set(e.event) is not None}
        missing = list(({e.event.originator_id for e, _ in calls} | reprioritised) - set(known))
        if missing:
            cur.execute(
                q(
                    "SELECT originator_id, subject_id, workflow, tenant, priority FROM {s}.subjects"
                    " WHERE originator_id = ANY(%s)",
                    schema,
                ),
                [missing],
            )
            known.update({row[0]: list(row[1:]) for row in cur.fetchall()})
        # In log order: a call was made at the priority its task had before the event that
        # records it (a Classified that raised the priority was routed by the one before).
        priority_at: dict[int, str | None] = {}
        for envelope in batch:
            subject = known.get(envelope.event.originator_id)
            if envelope.call is not None:
                priority_at[envelope.id] = subject[3] if subject is not None else None
            priority = _priority_set(envelope.event)
            if priority is not None and subject is not None:
                subject[3] = priority
        write_rows(cur, schema, "subjects", SUBJECT_COLUMNS, [(k, *known[k]) for k in created])
        changed = [(k, *known[k]) for k in reprioritised - set(created) if k in known]
        write_rows(cur, schema, "subjects", SUBJECT_COLUMNS, changed, key=("originator_id",))
        repricings = self._repricings.load(cur, Names.of_build(schema, self.name).control) if calls else []
        rows = []
        for envelope, call in calls:
            event, usage = envelope.event, call.usage
            if usage is not None:
                require_summable(usage)
            priced = call_cost(usage, event.timestamp, repricings) if usage else None
            # A call of a subject whose first event was not applied (a dead letter) has no
            # tenant: no tenant's dashboard shows it.
            subject_id, workflow, tenant, _ = known.get(event.originator_id, (None, "(unknown)", None, None))
            rows.append(
                (
                    envelope.id,
                    call.source,
                    event.originator_id,
                    event.originator_version,
                    subject_id,
                    workflow,
                    call.step,
                    call.error_type,
                    usage.provider if usage else None,
                    usage.request_model if usage else None,
                    usage.response_model if usage else None,
                    call.model,
                    usage.input_tokens if usage else 0,
                    usage.output_tokens if usage else 0,
                    usage.cache_read_input_tokens if usage else 0,
                    usage.reasoning_output_tokens if usage else 0,
                    priced.cost_usd if priced else 0,
                    priced.price_version if priced else None,
                    call.latency_ms,
                    usage.attempts if usage else None,
                    event.timestamp,
                    tenant,
                    usage.cache_creation_input_tokens if usage else 0,
                    usage.cache_creation_1h_input_tokens if usage else 0,
                    priced.unpriced if priced else False,
                    usage.cost_source or None if usage else None,
                    priced.retried_cost_usd if priced else 0,
                    priority_at[envelope.id] if call.source == "task" else None,
                    usage.audio_input_tokens if usage else 0,
                    usage.audio_output_tokens if usage else 0,
                    *(usage.retried_tokens.get(name, 0) if usage else 0 for name in TOKEN_FIELDS),
                )
            )
        write_rows(cur, schema, "llm_calls", CALL_COLUMNS, rows)
        if rows:
            add_calls_to_rollups(cur, schema, [row[0] for row in rows])

    def rebased(self, cur: Cursor[Any], schema: str) -> None:
        """Roll up the archived sessions' calls just put into the empty build."""
        add_calls_to_rollups(cur, schema)


def _priority_set(event: Any) -> str | None:
    """The priority an event gives its task (a classification's raise, or its undoing), if any."""
    return event.priority if isinstance(event, Task.Classified) else None
