"""Completion funnel: per session, which steps it reached, when, and how each last ended; and
the funnel's roll-ups (``funnel_rollups``), kept in the same transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import dict_row

from flowledger.domain.erased import ERASED_JSON
from flowledger.domain.session import Session
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.calls import call_of
from flowledger.projections.funnel_rollups import DDL as ROLLUP_DDL
from flowledger.projections.funnel_rollups import add_started_to_rollups, change_funnel_rollups
from flowledger.projections.sql import Column, dump_json, q, write_rows

Row = dict[str, Any]

SESSION_COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("workflow", "text"),
    ("session_id", "text"),
    ("started_at", "timestamptz"),
    ("status", "text"),
    ("metadata", "jsonb"),
    ("first_model", "text"),
    ("steps_reached", "integer"),
    ("tenant", "text"),
)
STEP_COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("step", "text"),
    ("workflow", "text"),
    ("first_reached_at", "timestamptz"),
    ("reach_order", "integer"),
    ("processed", "integer"),
    ("failed", "integer"),
    ("last_outcome", "text"),
    ("last_error_type", "text"),
    ("tenant", "text"),
)

DDL = """
CREATE TABLE {s}.funnel_sessions (
    originator_id uuid PRIMARY KEY,
    workflow text NOT NULL,
    session_id text NOT NULL,
    started_at timestamptz NOT NULL,
    status text NOT NULL,
    metadata jsonb NOT NULL,
    first_model text,
    steps_reached integer NOT NULL,
    tenant text NOT NULL
);
CREATE INDEX ON {s}.funnel_sessions (tenant, workflow, started_at);
CREATE TABLE {s}.funnel_steps (
    originator_id uuid NOT NULL,
    step text NOT NULL,
    workflow text NOT NULL,
    first_reached_at timestamptz NOT NULL,
    reach_order integer NOT NULL,
    processed integer NOT NULL,
    failed integer NOT NULL,
    last_outcome text NOT NULL,
    last_error_type text,
    tenant text NOT NULL,
    PRIMARY KEY (originator_id, step)
);
CREATE INDEX ON {s}.funnel_steps (workflow, step);
"""

_ENDINGS = {Session.Completed: "completed", Session.Expired: "expired", Session.Abandoned: "abandoned"}


def _reach(session: Row, steps: dict[str, Row], event: Any, step: str) -> Row:
    """The step's row, created when the session reaches the step for the first time."""
    row = steps.get(step)
    if row is None:
        session["steps_reached"] += 1
        row = {
            "originator_id": session["originator_id"],
            "step": step,
            "workflow": session["workflow"],
            "first_reached_at": event.timestamp,
            "reach_order": session["steps_reached"],
            "processed": 0,
            "failed": 0,
            "last_outcome": "started",
            "last_error_type": None,
            "tenant": session["tenant"],
        }
        steps[step] = row
    row["dirty"] = True
    return row


def fold(session: Row, steps: dict[str, Row], event: Any) -> None:
    """Apply one later event of the session to its funnel rows (in place; changed step rows
    are marked ``dirty``)."""
    if isinstance(event, Session.StepStarted):
        _reach(session, steps, event, event.step)["last_outcome"] = "started"
    elif isinstance(event, Session.StepProcessed):
        row = _reach(session, steps, event, event.step)
        row["processed"] += 1
        row["last_outcome"], row["last_error_type"] = "processed", None
    elif isinstance(event, Session.StepFailed):
        row = _reach(session, steps, event, event.step)
        row["failed"] += 1
        row["last_outcome"], row["last_error_type"] = "failed", event.error_type
    elif type(event) in _ENDINGS:
        session["status"] = _ENDINGS[type(event)]
    elif isinstance(event, Session.Restarted | Session.Reopened):
        session["status"] = "active"
    elif isinstance(event, Session.DataErased):
        session["metadata"] = dict(ERASED_JSON)
    if session["first_model"] is None and getattr(event, "usage", None) is not None:
        call = call_of(event)
        session["first_model"] = call.model if call is not None else None


class CompletionFunnel(Projection):
    """Which steps each session reached, for funnels per workflow."""

    name = "funnel"
    exposed = ("funnel_sessions", "funnel_steps", "funnel_paths", "funnel_reach", "funnel_firsts")
    ddl = DDL + ROLLUP_DDL
    # 2: tenant on every row; 3: roll-ups; 4: paths keyed by their hash; 5: funnel_reach too
    schema_version = 5
    base_versions = (3, 4)  # a v3 or v4 base's rows (sessions and steps) fit as they are
    handles = (
        Session.Started,
        Session.StepStarted,
        Session.StepProcessed,
        Session.StepFailed,
        Session.Completed,
        Session.Expired,
        Session.Abandoned,
        Session.Restarted,
        Session.Reopened,
        Session.DataErased,
    )

    def rebased(self, cur: Cursor[Any], schema: str) -> None:
        """Roll up the archived sessions just put into the empty build."""
        add_started_to_rollups(cur, schema, "-infinity", "infinity")

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Fold the batch into the touched sessions' rows, then upsert those rows."""
        events = [e.event for e in batch if isinstance(e.event, Session.Event)]
        if not events:
            return
        sessions, steps = self._load(cur, schema, events)
        change_funnel_rollups(cur, schema, list(sessions), -1)  # as they were; added back below
        for event in events:
            key = event.originator_id
            if isinstance(event, Session.Started):
                sessions[key] = {
                    "originator_id": key,
                    "workflow": event.workflow,
                    "session_id": event.session_id,
                    "started_at": event.timestamp,
                    "status": "active",
                    "metadata": event.metadata,
                    "first_model": None,
                    "steps_reached": 0,
                    "tenant": event.tenant,
                }
                steps[key] = {}
            elif key in sessions:
                fold(sessions[key], steps[key], event)
        session_rows = [
            [dump_json(r[n]) if n == "metadata" else r[n] for n, _ in SESSION_COLUMNS]
            for r in sessions.values()
        ]
        write_rows(cur, schema, "funnel_sessions", SESSION_COLUMNS, session_rows, key=("originator_id",))
        step_rows = [
            [r[n] for n, _ in STEP_COLUMNS]
            for rows in steps.values()
            for r in rows.values()
            if r.get("dirty")
        ]
        write_rows(cur, schema, "funnel_steps", STEP_COLUMNS, step_rows, key=("originator_id", "step"))
        change_funnel_rollups(cur, schema, list(sessions), 1)

    @staticmethod
    def _load(
        cur: Cursor[Any], schema: str, events: Sequence[Any]
    ) -> tuple[dict[UUID, Row], dict[UUID, dict[str, Row]]]:
        started = {e.originator_id for e in events if isinstance(e, Session.Started)}
        wanted = list({e.originator_id for e in events} - started)
        sessions: dict[UUID, Row] = {}
        steps: dict[UUID, dict[str, Row]] = {}
        if not wanted:
            return sessions, steps
        with cur.connection.cursor(row_factory=dict_row) as dict_cur:
            dict_cur.execute(
                q("SELECT * FROM {s}.funnel_sessions WHERE originator_id = ANY(%s)", schema), [wanted]
            )
            for row in dict_cur.fetchall():
                sessions[row["originator_id"]] = row
                steps[row["originator_id"]] = {}
            dict_cur.execute(
                q("SELECT * FROM {s}.funnel_steps WHERE originator_id = ANY(%s)", schema), [wanted]
            )
            for row in dict_cur.fetchall():
                steps[row["originator_id"]][row["step"]] = row
        return sessions, steps
