"""Completion funnel query: per step in order, sessions reaching it, conversion, why sessions
stopped there, and how long they took to get there.

A session's furthest step is the last one (in step order) it reached. Why it stopped:
``completed`` (not a drop), else ``failed`` if its last outcome there was a failure (with the
error type), else ``expired`` / ``abandoned``, else ``in_progress`` (not counted as dropped).

Conversion from the previous step follows each session's own path, so it never exceeds 100 %
when sessions take different branches: a step's previous steps are those some session reached
right before it (the start, for a first step), and its conversion is the sessions reaching it
over the sessions that reached any of its previous steps. Dividing by the step shown above it
instead read 66500 % once a branch's step followed another branch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.errors import ValidationError
from flowledger.projections.cost_queries import RAW_WINDOW, READS
from flowledger.projections.windows import require_window

DROPS = ("failed", "expired", "abandoned")


@dataclass
class FunnelStep:
    """One step of the funnel."""

    step: str
    reached: int = 0
    processed: int = 0
    overall_conversion: float = 0.0
    step_conversion: float = 0.0
    dropped: dict[str, int] = field(default_factory=dict)
    failed_by_error: dict[str, int] = field(default_factory=dict)
    in_progress: int = 0
    completed: int = 0
    p50_seconds: float | None = None
    p95_seconds: float | None = None

    @property
    def dropped_total(self) -> int:
        """Sessions that stopped at this step and will not go on (failed, expired, abandoned)."""
        return sum(self.dropped.values())

    def drops(self) -> list[tuple[str, str | None, int]]:
        """Why sessions stopped here as (cause, error type, sessions), the failures one entry per
        error type (the others with None), by cause then error type: what the CLI and the page
        both write (the page wrote "failed 1" without the type the CLI and the JSON gave)."""
        failed = [("failed", error, n) for error, n in self.failed_by_error.items()]
        others = [(cause, None, n) for cause, n in self.dropped.items() if cause != "failed"]
        return sorted([*failed, *others], key=lambda d: (d[0], d[1] or ""))


@dataclass
class FunnelReport:
    """The funnel of one workflow (and one segment, when broken down). Broken down, the
    sessions without the breakdown's value (no model called, no such metadata key) are the
    report whose ``segment`` is None."""

    workflow: str
    segment: str | None
    sessions: int = 0
    before_first_step: dict[str, int] = field(default_factory=dict)
    steps: list[FunnelStep] = field(default_factory=list)

    def no_step_note(self) -> str | None:
        """What became of the sessions that reached no step, as one line (they are counted in
        ``sessions`` and in no step's row); None when every session reached one."""
        stopped = sum(self.before_first_step.values())
        if not stopped:
            return None
        causes = ", ".join(f"{c.replace('_', ' ')} {n}" for c, n in sorted(self.before_first_step.items()))
        return f"{stopped} of {self.sessions} sessions reached no step: {causes}"


def _segment(by: str | None) -> sql.Composable:
    if by is None:
        return sql.SQL("NULL::text")
    # Sessions without the value (no model called, no such metadata key) are the segment None:
    # as the text '(none)' they were one segment with a model or value named "(none)".
    if by == "model":
        return sql.SQL("first_model")
    if by.startswith("metadata."):
        # The key goes as a parameter: as a literal in the text, a key like "%s" read as a
        # placeholder and the query failed ("positional and named placeholders cannot be mixed").
        return sql.SQL("metadata ->> %(segment_key)s")
    raise ValidationError("by", f"breakdown must be 'model' or 'metadata.<key>', not {by!r}")


PREFIX = """
WITH s AS (
    SELECT originator_id, started_at, status, {segment} AS segment FROM {r}.funnel_sessions
    WHERE tenant = %(tenant)s AND workflow = %(workflow)s
      AND (%(since)s::timestamptz IS NULL OR started_at >= %(since)s)
      AND (%(until)s::timestamptz IS NULL OR started_at < %(until)s)
), st AS (
    SELECT f.*, s.started_at, s.status, s.segment
    FROM {r}.funnel_steps AS f JOIN s USING (originator_id)
), ord AS ({order}),
r AS (SELECT st.*, ord.idx FROM st JOIN ord USING (step)),
furthest AS (
    SELECT DISTINCT ON (originator_id) originator_id, idx, last_outcome, last_error_type
    FROM r ORDER BY originator_id, idx DESC
)
"""
# A tie goes by code point (COLLATE "C"), as the roll-up read sorts: under the database's
# collation (en-US: 'a' before 'B') the two reads listed tied steps in different orders.
AUTO_ORDER = (
    "SELECT step, row_number() OVER (ORDER BY avg(reach_order), min(first_reached_at),"
    ' step COLLATE "C") AS idx FROM st GROUP BY step'
)
GIVEN_ORDER = "SELECT step, idx FROM unnest(%(steps)s::text[]) WITH ORDINALITY AS o(step, idx)"
REACHED = """
SELECT segment, idx, step, count(*), count(*) FILTER (WHERE processed > 0),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM first_reached_at - started_at)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM first_reached_at - started_at))
FROM r GROUP BY segment, idx, step ORDER BY segment, idx
"""
PREVIOUS = """,
edges AS (
    SELECT DISTINCT a.segment, a.step, b.step AS previous
    FROM st AS a LEFT JOIN st AS b ON b.originator_id = a.originator_id AND b.reach_order = a.reach_order - 1
    WHERE a.step IN (SELECT step FROM ord)
),
before AS (
    SELECT e.segment, e.step, x.originator_id
    FROM edges AS e JOIN st AS x ON x.segment IS NOT DISTINCT FROM e.segment AND x.step = e.previous
    UNION
    SELECT e.segment, e.step, x.originator_id
    FROM edges AS e JOIN s AS x ON x.segment IS NOT DISTINCT FROM e.segment WHERE e.previous IS NULL
)
SELECT segment, step, count(*) FROM before GROUP BY segment, step
"""
KNOWN_STEPS = """
SELECT DISTINCT step FROM {r}.funnel_steps WHERE tenant = %(tenant)s AND workflow = %(workflow)s ORDER BY 1
"""
ENDINGS = """
SELECT s.segment, f.idx,
       CASE WHEN s.status = 'completed' THEN 'completed'
            WHEN f.last_outcome = 'failed' THEN 'failed'
            WHEN s.status IN ('expired', 'abandoned') THEN s.status
            ELSE 'in_progress' END AS cause,
       CASE WHEN s.status <> 'completed' AND f.last_outcome = 'failed' THEN f.last_error_type END,
       count(*)
FROM s LEFT JOIN furthest AS f USING (originator_id) GROUP BY 1, 2, 3, 4
"""


def funnel_report(
    conn: Connection[Any],
    reader: str,
    workflow: str,
    *,
    tenant: str,
    steps: Sequence[str] | None = None,
    by: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    read: str = "auto",
) -> list[FunnelReport]:
    """The funnel of ``tenant``'s sessions of ``workflow`` started in the window, one report per segment.

    ``read`` is as ``cost_queries.dashboard``'s: ``raw`` rows, the ``rollups`` (not for a
    ``metadata.<key>`` breakdown, which has no roll-up), or ``auto``: the roll-ups for windows
    of ``RAW_WINDOW`` or more (and no ``since``) unless broken down by metadata.

    Steps come in ``steps`` order when given (each a step the workflow has; ValidationError
    naming the known ones otherwise), else by the average position at which sessions first
    reached them. ``by`` is ``"model"`` (each session's first model) or ``"metadata.<key>"``.
    """
    require_window(since, until)
    if steps:
        _require_known_steps(conn, reader, workflow, tenant, steps)
    _segment(by)
    if _reads_rollups(read, by, since, until):
        # Imported here: that module builds on this one's FunnelReport and FunnelStep.
        from flowledger.projections.funnel_rollup_queries import rollup_funnel

        return rollup_funnel(
            conn, reader, workflow, tenant=tenant, steps=steps, by=by, since=since, until=until
        )
    prefix = sql.SQL(PREFIX).format(
        segment=_segment(by),
        r=sql.Identifier(reader),
        order=sql.SQL(GIVEN_ORDER if steps else AUTO_ORDER),
    )
    params = {
        "tenant": tenant,
        "workflow": workflow,
        "since": since,
        "until": until,
        "steps": list(steps or []),
        "segment_key": by[9:] if by is not None else None,
    }
    reports: dict[str | None, FunnelReport] = {}
    positions: dict[tuple[str | None, int], FunnelStep] = {}
    for segment, idx, step, reached, processed, p50, p95 in conn.execute(
        prefix + sql.SQL(REACHED), params
    ).fetchall():
        report = reports.setdefault(segment, FunnelReport(workflow, segment))
        entry = FunnelStep(step, reached, processed, p50_seconds=p50, p95_seconds=p95)
        report.steps.append(entry)
        positions[segment, idx] = entry
    for segment, idx, cause, error_type, count in conn.execute(prefix + sql.SQL(ENDINGS), params).fetchall():
        report = reports.setdefault(segment, FunnelReport(workflow, segment))
        report.sessions += count
        if idx is None:
            report.before_first_step[cause] = report.before_first_step.get(cause, 0) + count
            continue
        _count_ending(positions[segment, idx], cause, error_type, count)
    before = {
        (segment, step): count for segment, step, count in conn.execute(prefix + sql.SQL(PREVIOUS), params)
    }
    for report in reports.values():
        for entry in report.steps:
            entry.overall_conversion = entry.reached / report.sessions if report.sessions else 0.0
            came_from = before.get((report.segment, entry.step), 0)
            entry.step_conversion = entry.reached / came_from if came_from else 0.0
    return sorted(reports.values(), key=lambda r: (r.segment is not None, r.segment or ""))


def _require_known_steps(
    conn: Connection[Any], reader: str, workflow: str, tenant: str, steps: Sequence[str]
) -> None:
    """Refuse a step order naming a step twice or a step no session of the workflow reached."""
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
        raise ValidationError("steps", f"name each step once; repeated: {', '.join(map(repr, repeated))}")
    statement = sql.SQL(KNOWN_STEPS).format(r=sql.Identifier(reader))
    known = [row[0] for row in conn.execute(statement, {"tenant": tenant, "workflow": workflow})]
    unknown = [s for s in steps if s not in known]
    if unknown:
        names = ", ".join(known) if known else "none: no session of it reached a step"
        raise ValidationError(
            "steps", f"unknown in workflow {workflow!r}: {', '.join(unknown)}; known steps: {names}"
        )


def _reads_rollups(read: str, by: str | None, since: datetime | None, until: datetime | None) -> bool:
    if read not in READS:
        raise ValidationError("read", f"must be one of {list(READS)}, not {read!r}")
    if read == "raw":
        return False
    if by is not None and by != "model":
        if read == "rollups":
            raise ValidationError("read", f"a breakdown by {by!r} has no roll-up: read the raw rows")
        return False
    if read == "rollups" or since is None:
        return True
    end = until if until is not None else datetime.now(UTC)
    return end - since >= RAW_WINDOW


def _count_ending(entry: FunnelStep, cause: str, error_type: str | None, count: int) -> None:
    if cause == "completed":
        entry.completed += count
    elif cause == "in_progress":
        entry.in_progress += count
    else:
        entry.dropped[cause] = entry.dropped.get(cause, 0) + count
        if cause == "failed":
            key = error_type or "(unknown)"
            entry.failed_by_error[key] = entry.failed_by_error.get(key, 0) + count


def workflows(
    conn: Connection[Any],
    reader: str,
    *,
    tenant: str,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[str]:
    """The workflows of ``tenant``'s sessions started in the window, by name."""
    require_window(since, until)
    statement = sql.SQL(
        "SELECT DISTINCT workflow FROM {}.funnel_sessions WHERE tenant = %(tenant)s"
        " AND (%(since)s::timestamptz IS NULL OR started_at >= %(since)s)"
        " AND (%(until)s::timestamptz IS NULL OR started_at < %(until)s) ORDER BY 1"
    ).format(sql.Identifier(reader))
    rows = conn.execute(statement, {"tenant": tenant, "since": since, "until": until}).fetchall()
    return [row[0] for row in rows]
