"""Seed compatibility: the seed article's ``workflow_states`` and ``workflow_executions`` tables.

Same names and columns as the article's schema (plus ``originator_id``, ``version`` and ``tenant``),
so its dashboard queries run unchanged. Ids are notification ids, so a rebuild gives the
same ids; execution rows are exactly the cost table's calls of sessions (``source = 'session'``:
a task's calls belong to no workflow session and are not among them). For one tenant's rows
only, run the queries against ``tenant_reader``'s schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import dict_row

from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT
from flowledger.domain.session import Session
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.catalog import Names
from flowledger.projections.repricing import RepricingCache, call_cost
from flowledger.projections.sql import Column, dump_json, q, write_rows

Row = dict[str, Any]

STATE_COLUMNS: tuple[Column, ...] = (
    ("id", "bigint"),
    ("originator_id", "uuid"),
    ("session_id", "text"),
    ("user_id", "text"),
    ("workflow_name", "text"),
    ("current_step", "text"),
    ("context_data", "jsonb"),
    ("step_history", "jsonb"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
    ("expires_at", "timestamptz"),
    ("metadata", "jsonb"),
    ("version", "integer"),
    ("tenant", "text"),
)
_JSON = {name for name, kind in STATE_COLUMNS if kind == "jsonb"}
EXECUTION_COLUMNS: tuple[Column, ...] = (
    ("id", "bigint"),
    ("workflow_id", "bigint"),
    ("step_name", "text"),
    ("input_data", "jsonb"),
    ("output_data", "jsonb"),
    ("model_used", "text"),
    ("tokens_used", "bigint"),
    ("cost_usd", "numeric"),
    ("latency_ms", "double precision"),
    ("executed_at", "timestamptz"),
    ("error_message", "text"),
    ("tenant", "text"),
)

DDL = """
CREATE TABLE {s}.workflow_states (
    id bigint PRIMARY KEY,
    originator_id uuid NOT NULL UNIQUE,
    session_id varchar(255) NOT NULL,
    user_id varchar(255),
    workflow_name varchar(200) NOT NULL,
    current_step varchar(200) NOT NULL DEFAULT 'init',
    context_data jsonb DEFAULT '{{}}',
    step_history jsonb DEFAULT '[]',
    created_at timestamptz,
    updated_at timestamptz,
    expires_at timestamptz,
    metadata jsonb DEFAULT '{{}}',
    version integer NOT NULL,
    tenant text NOT NULL
);
CREATE INDEX ON {s}.workflow_states (tenant, session_id);
CREATE INDEX ON {s}.workflow_states (user_id);
CREATE INDEX ON {s}.workflow_states (expires_at);
CREATE INDEX ON {s}.workflow_states (updated_at);
CREATE TABLE {s}.workflow_executions (
    id bigint PRIMARY KEY,
    workflow_id bigint REFERENCES {s}.workflow_states (id),
    step_name varchar(200),
    input_data jsonb,
    output_data jsonb,
    model_used text,
    tokens_used bigint,
    cost_usd numeric,
    latency_ms double precision,
    executed_at timestamptz,
    error_message text,
    tenant text NOT NULL
);
CREATE INDEX ON {s}.workflow_executions (workflow_id);
CREATE INDEX ON {s}.workflow_executions (executed_at);
"""


def fold(row: Row, event: Any, cost: Decimal | None = None) -> None:
    """Apply one later event of the session to its ``workflow_states`` row (in place); a step's
    ``ai_cost`` is ``cost`` (its execution row's), else what its usage says it was billed."""
    if isinstance(event, Session.StepProcessed):
        row["current_step"] = event.next_step or event.step
        if event.context_update:
            row["context_data"] = {**row["context_data"], **event.context_update}
        entry: dict[str, Any] = {"step": event.step, "timestamp": event.timestamp.isoformat()}
        if event.usage is not None:
            # Every billed attempt's, as the webhook's get_state answers: the answer's alone
            # left the history short of the execution rows by the retried attempts.
            entry["ai_cost"] = str(event.usage.charged_usd if cost is None else cost)
        row["step_history"] = [*row["step_history"], entry]
    elif isinstance(event, Session.ContextUpdated):
        row["context_data"] = {**row["context_data"], **event.update}
    elif isinstance(event, Session.Extended | Session.Reopened):
        row["expires_at"] = event.expires_at
    elif isinstance(event, Session.Restarted):
        # The seed's ON CONFLICT ... SET current_step = 'init'.
        row.update(current_step="init", expires_at=event.expires_at, user_id=event.user_id)
    elif isinstance(event, Session.Forked):
        row["current_step"] = event.current_step
        row["context_data"] = event.context
    elif isinstance(event, Session.DataErased):
        if row["user_id"] is not None:
            row["user_id"] = ERASED_TEXT
        row["context_data"] = dict(ERASED_JSON) if row["context_data"] else {}
        row["metadata"] = dict(ERASED_JSON)
    row["updated_at"] = event.timestamp
    row["version"] = event.originator_version


_ERASE_EXECUTIONS = (
    "UPDATE {s}.workflow_executions SET "
    "input_data = CASE WHEN jsonb_typeof(input_data) = 'object' THEN %(m)s::jsonb ELSE input_data END, "
    "output_data = CASE WHEN jsonb_typeof(output_data) = 'object' THEN %(m)s::jsonb ELSE output_data END, "
    "error_message = split_part(error_message, ': ', 1) || ': ' || %(t)s "
    "WHERE workflow_id = ANY(%(ids)s)"
)
"""A session's calls as their events read once erased (a failed step's null input stays null;
its ``error_type: message`` keeps the type, a code such as ``budget_exceeded`` or ``http_429``
with no ``": "`` in it, and its message reads as the marker). NULL (no error) stays NULL."""


class SeedTables(Projection):
    """The seed article's two tables, kept from the events."""

    name = "seed"
    exposed = ("workflow_states", "workflow_executions")
    ddl = DDL
    # 2: tenant on every row; 3: no latency unless one was measured; 4: an execution's cost, and
    # its step's ai_cost, is what the call was billed (retried attempts, repricings), as the
    # dashboard's; 5: its tokens_used, every attempt's too
    schema_version = 5
    base_versions = (2, 3, 4)  # an archived session's rows fit unchanged (kept as archived)
    handles = (Session,)

    def __init__(self) -> None:
        self._repricings = RepricingCache()

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Upsert the touched sessions' state rows, then insert one execution row per call."""
        entries = [e for e in batch if isinstance(e.event, Session.Event)]
        if not entries:
            return
        rows = self._load(cur, schema, [e.event for e in entries])
        calls = any(e.call is not None and e.call.usage is not None for e in entries)
        repricings = self._repricings.load(cur, Names.of_build(schema, self.name).control) if calls else []
        executions = []
        for envelope in entries:
            event = envelope.event
            if isinstance(event, Session.Started):
                rows[event.originator_id] = {
                    "id": envelope.id,
                    "originator_id": event.originator_id,
                    "session_id": event.session_id,
                    "user_id": event.user_id,
                    "workflow_name": event.workflow,
                    "current_step": "init",
                    "context_data": {},
                    "step_history": [],
                    "created_at": event.timestamp,
                    "updated_at": event.timestamp,
                    "expires_at": event.expires_at,
                    "metadata": event.metadata,
                    "version": event.originator_version,
                    "tenant": event.tenant,
                }
                continue
            row = rows.get(event.originator_id)
            if row is None:
                continue
            call = envelope.call
            usage = None if call is None else call.usage
            cost = None if usage is None else call_cost(usage, event.timestamp, repricings).charged_usd
            fold(row, event, cost)
            if call is not None:
                error = f"{call.error_type}: {call.error_message}" if call.error_type else None
                executions.append(
                    (
                        envelope.id,
                        row["id"],
                        call.step,
                        dump_json(call.input),
                        dump_json(call.output),
                        call.model,
                        # Every attempt's tokens, as the cost beside them (and the dashboard's
                        # input plus output): the answer's alone fell short by the retries'.
                        usage.billed_tokens("input_tokens") + usage.billed_tokens("output_tokens")
                        if usage
                        else 0,
                        # The cost dashboard's: what every attempt was billed, at the
                        # repricing in force. The answer's recorded cost alone left the seed's
                        # SUM(cost_usd) short of the dashboard's by the retried attempts.
                        cost if cost is not None else 0,
                        call.latency_ms,
                        event.timestamp,
                        error,
                        row["tenant"],
                    )
                )
        states = [[dump_json(r[n]) if n in _JSON else r[n] for n, _ in STATE_COLUMNS] for r in rows.values()]
        write_rows(cur, schema, "workflow_states", STATE_COLUMNS, states, key=("id",))
        write_rows(cur, schema, "workflow_executions", EXECUTION_COLUMNS, executions)
        erased = [
            rows[e.event.originator_id]["id"]
            for e in entries
            if isinstance(e.event, Session.DataErased) and e.event.originator_id in rows
        ]
        if erased:
            # After the inserts above: a call of this batch is erased as well.
            cur.execute(
                q(_ERASE_EXECUTIONS, schema), {"m": dump_json(ERASED_JSON), "t": ERASED_TEXT, "ids": erased}
            )

    @staticmethod
    def _load(cur: Cursor[Any], schema: str, events: Sequence[Any]) -> dict[UUID, Row]:
        started = {e.originator_id for e in events if isinstance(e, Session.Started)}
        wanted = list({e.originator_id for e in events} - started)
        if not wanted:
            return {}
        with cur.connection.cursor(row_factory=dict_row) as dict_cur:
            dict_cur.execute(
                q("SELECT * FROM {s}.workflow_states WHERE originator_id = ANY(%s)", schema), [wanted]
            )
            return {row["originator_id"]: row for row in dict_cur.fetchall()}
