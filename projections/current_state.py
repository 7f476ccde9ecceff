"""Current state: one row per session, task and agent, as it stands after the last event."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import dict_row

from flowledger.domain.agent import Agent
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT, erased_json
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.values import LlmUsage
from flowledger.projections import work_rows
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.calls import require_summable
from flowledger.projections.sql import Column, dump_json, q, write_rows
from flowledger.projections.work_rows import charged

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
    ("audio_input_tokens", "bigint"),
    ("audio_output_tokens", "bigint"),
    ("cache_creation_input_tokens", "bigint"),
    ("cache_creation_1h_input_tokens", "bigint"),
)

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
    version integer NOT NULL,
    audio_input_tokens bigint NOT NULL DEFAULT 0,
    audio_output_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_1h_input_tokens bigint NOT NULL DEFAULT 0
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
        "audio_input_tokens": 0,
        "audio_output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
    }


def _add_usage(row: Row, usage: LlmUsage | None) -> None:
    if usage is None:
        return
    billed = require_summable(usage)
    row["calls"] += 1
    # Every attempt's tokens, as its cost counts every attempt (and as the session's totals do):
    # a session row's token columns are named as ``TOKEN_FIELDS``.
    for name, count in billed.items():
        row[name] += count
    row["cost_usd"] = charged(row["cost_usd"], usage)


def erase_row(row: Row) -> None:
    """The personal values of a session's row, as ``Session.DataErased`` leaves them in its state."""
    if row["user_id"] is not None:
        row["user_id"] = ERASED_TEXT
    row["context"] = dict(ERASED_JSON) if row["context"] else {}
    row["metadata"] = dict(ERASED_JSON)
    row["resolution"] = erased_json(row["resolution"])


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
    elif isinstance(event, Session.Restarted):
        row.update(current_step="init", status="active", expires_at=event.expires_at, user_id=event.user_id)
    elif isinstance(event, Session.Reopened):
        row.update(status="active", expires_at=event.expires_at)
    elif isinstance(event, Session.Completed):
        row["status"] = "completed"
        row["resolution"] = event.resolution
    elif isinstance(event, Session.Expired):
        row["status"] = "expired"
    elif isinstance(event, Session.Abandoned):
        row["status"] = "abandoned"
    elif isinstance(event, Session.Forked):
        row["current_step"] = event.current_step
        row["context"] = event.context
    elif isinstance(event, Session.DataErased):
        erase_row(row)
    row["updated_at"] = event.timestamp
    row["version"] = event.originator_version


@dataclass(frozen=True)
class _Table:
    """One aggregate type's table: which events feed it and how they fold into a row."""

    name: str
    columns: tuple[Column, ...]
    events: type[Any]
    created: type[Any]
    create: Callable[[Any], Row]
    fold: Callable[[Row, Any], None]


TABLES = (
    _Table("sessions", COLUMNS, Session.Event, Session.Started, started_row, fold),
    _Table(
        "tasks",
        work_rows.TASK_COLUMNS,
        Task.Event,
        Task.Created,
        work_rows.created_task_row,
        work_rows.fold_task,
    ),
    _Table(
        "agents",
        work_rows.AGENT_COLUMNS,
        Agent.Event,
        Agent.Registered,
        work_rows.registered_agent_row,
        work_rows.fold_agent,
    ),
)


class CurrentState(Projection):
    """Where every session, task and agent stands now."""

    name = "current_state"
    # 2: a task's cost counts its discarded (paid) classification calls; 3: a requeue sets the
    # task's new deadline and clears its escalation reason (sessions' rows unchanged); 4: a
    # session's and a task's cost count what their retried attempts were billed (charged_usd), as
    # the session's totals and the cost dashboard do (archived v2/v3 rows keep the cost they had);
    # 5: a session's audio input and output tokens (archived rows from before had none read: 0);
    # 6: its cache writes, as the cost dashboard's (archived rows from before read 0: their
    # sessions' calls' writes were not summed then); 7: its token sums count its calls' retried
    # attempts (``billed_tokens``), as its cost and its totals do (archived rows fold as archived)
    schema_version = 7
    base_versions = (2, 3, 4, 5, 6)
    base_defaults = {
        "sessions": {
            "audio_input_tokens": 0,
            "audio_output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_creation_1h_input_tokens": 0,
        }
    }
    exposed = ("sessions", "tasks", "agents")
    ddl = DDL + work_rows.DDL
    handles = (Session, Task, Agent)

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Fold the batch's events into their rows, then upsert the touched rows."""
        for table in TABLES:
            events = [e.event for e in batch if isinstance(e.event, table.events)]
            if events:
                self._apply(cur, schema, table, events)

    @staticmethod
    def _apply(cur: Cursor[Any], schema: str, table: _Table, events: Sequence[Any]) -> None:
        rows = _load(cur, schema, table, events)
        for event in events:
            if isinstance(event, table.created):
                rows[event.originator_id] = table.create(event)
            elif event.originator_id in rows:
                table.fold(rows[event.originator_id], event)
        json_columns = {n for n, kind in table.columns if kind == "jsonb"}
        values = [
            [dump_json(row[n]) if n in json_columns else row[n] for n, _ in table.columns]
            for row in rows.values()
        ]
        write_rows(cur, schema, table.name, table.columns, values, key=("originator_id",))


def _load(cur: Cursor[Any], schema: str, table: _Table, events: Sequence[Any]) -> dict[UUID, Row]:
    """The stored rows of the aggregates the events touch (those not created in this batch)."""
    created = {e.originator_id for e in events if isinstance(e, table.created)}
    wanted = list({e.originator_id for e in events} - created)
    if not wanted:
        return {}
    with cur.connection.cursor(row_factory=dict_row) as dict_cur:
        dict_cur.execute(
            q("SELECT * FROM {s}.{t} WHERE originator_id = ANY(%s)", schema, t=table.name), [wanted]
        )
        return {row["originator_id"]: row for row in dict_cur.fetchall()}
