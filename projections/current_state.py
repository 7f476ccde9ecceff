"""Current state: one row per session, as it stands after the last event applied."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import dict_row

from flowledger.domain.session import Session
from flowledger.domain.values import LlmUsage
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.sql import Column, dump_json, q, write_rows

Row = dict[str, Any]

COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("session_id", "text"),
    ("tenant", "text"),
    ("workflow", "text"),
    ("user_id", "text"),
    ("status", "text"),
    ("current_step", "text"),
    ("context", "jsonb"),
    ("metadata", "jsonb"),
    ("resolution", "jsonb"),
    ("step_count", "integer"),
    ("failure_count", "integer"),
    ("calls", "integer"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cache_read_input_tokens", "bigint"),
    ("reasoning_output_tokens", "bigint"),
    ("cost_usd", "numeric"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
    ("expires_at", "timestamptz"),
    ("version", "integer"),
)
_JSON = {name for name, kind in COLUMNS if kind == "jsonb"}

DDL = """
CREATE TABLE {s}.sessions (
    originator_id uuid PRIMARY KEY,
    session_id text NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    user_id text,
    status text NOT NULL,
    current_step text NOT NULL,
    context jsonb NOT NULL,
    metadata jsonb NOT NULL,
    resolution jsonb,
    step_count integer NOT NULL,
    failure_count integer NOT NULL,
    calls integer NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_input_tokens bigint NOT NULL,
    reasoning_output_tokens bigint NOT NULL,
    cost_usd numeric NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    version integer NOT NULL
);
CREATE INDEX ON {s}.sessions (tenant, session_id);
CREATE INDEX ON {s}.sessions (workflow, status);
CREATE INDEX ON {s}.sessions (updated_at);
"""


def started_row(event: Session.Started) -> Row:
    """The row of a session that has just started."""
    return {
        "originator_id": event.originator_id,
        "session_id": event.session_id,
        "tenant": event.tenant,
        "workflow": event.workflow,
        "user_id": event.user_id,
        "status": "active",
        "current_step": "init",
        "context": {},
        "metadata": event.metadata,
        "resolution": None,
        "step_count": 0,
        "failure_count": 0,
        "calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "reasoning_output_tokens": 0,
        "cost_usd": Decimal(0),
        "created_at": event.timestamp,
        "updated_at": event.timestamp,
        "expires_at": event.expires_at,
        "version": event.originator_version,
    }


def _add_usage(row: Row, usage: LlmUsage | None) -> None:
    if usage is None:
        return
    row["calls"] += 1
    row["input_tokens"] += usage.input_tokens
    row["output_tokens"] += usage.output_tokens
    row["cache_read_input_tokens"] += usage.cache_read_input_tokens
    row["reasoning_output_tokens"] += usage.reasoning_output_tokens
    row["cost_usd"] += usage.cost_usd


def fold(row: Row, event: Any) -> None:
    """Apply one later event of the session to its row (in place)."""
    if isinstance(event, Session.StepProcessed):
        row["step_count"] += 1
        row["current_step"] = event.next_step or event.step
        if event.context_update:
            row["context"] = {**row["context"], **event.context_update}
        _add_usage(row, event.usage)
    elif isinstance(event, Session.StepFailed):
        row["failure_count"] += 1
        _add_usage(row, event.usage)
    elif isinstance(event, Session.ContextUpdated):
        row["context"] = {**row["context"], **event.update}
    elif isinstance(event, Session.Extended):
        row["expires_at"] = event.expires_at
    elif isinstance(event, Session.Completed):
        row["status"] = "completed"
        row["resolution"] = event.resolution
    elif isinstance(event, Session.Expired):
        row["status"] = "expired"
    elif isinstance(event, Session.Abandoned):
        row["status"] = "abandoned"
    row["updated_at"] = event.timestamp
    row["version"] = event.originator_version


class CurrentState(Projection):
    """Where every session stands now."""

    name = "current_state"
    exposed = ("sessions",)
    ddl = DDL

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Fold the batch's session events into their rows, then upsert the touched rows."""
        events = [e.event for e in batch if isinstance(e.event, Session.Event)]
        if not events:
            return
        rows = self._load(cur, schema, events)
        for event in events:
            if isinstance(event, Session.Started):
                rows[event.originator_id] = started_row(event)
            elif event.originator_id in rows:
                fold(rows[event.originator_id], event)
        write_rows(
            cur,
            schema,
            "sessions",
            COLUMNS,
            [
                [dump_json(row[n]) if n in _JSON else row[n] for n, _ in COLUMNS]
                for row in rows.values()
            ],
            key=("originator_id",),
        )

    @staticmethod
    def _load(cur: Cursor[Any], schema: str, events: Sequence[Any]) -> dict[UUID, Row]:
        started = {e.originator_id for e in events if isinstance(e, Session.Started)}
        wanted = list({e.originator_id for e in events} - started)
        if not wanted:
            return {}
        with cur.connection.cursor(row_factory=dict_row) as dict_cur:
            dict_cur.execute(
                q("SELECT * FROM {s}.sessions WHERE originator_id = ANY(%s)", schema), [wanted]
            )
            return {row["originator_id"]: row for row in dict_cur.fetchall()}
