"""The completion funnel read from its roll-ups (``funnel_rollups``): the window of session
starts is cut into whole days, hours and minutes with raw rows at its edges (``windows.cover``),
the paths and histograms are summed, and the funnel is worked out here from the summed paths:
the same numbers as ``funnel_queries``' raw query, percentiles within ``RELATIVE_ERROR``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from psycopg import Connection, sql

from flowledger.projections.cost_rollup_queries import ranges
from flowledger.projections.funnel_queries import FunnelReport, FunnelStep, _count_ending
from flowledger.projections.funnel_rollups import REACHES, SESSIONS, seconds_bucket_sql
from flowledger.projections.latency_sketch import percentiles
from flowledger.projections.windows import cover

BEGINNING = datetime(1, 1, 1, tzinfo=UTC)
"""Where a window without ``since`` starts."""

_PIECES = """
WHERE r.tenant = %(tenant)s AND r.workflow = %(workflow)s AND ({rolled_where})
"""
_RAW = "s.tenant = %(tenant)s AND s.workflow = %(workflow)s AND ({raw_where})"
_PATHS = f"""
SELECT {{segment}} AS segment, status, path, sum(sessions) FROM {{r}}.funnel_paths AS r {_PIECES}
GROUP BY 1, 2, 3
UNION ALL
SELECT {{segment}}, status, path, count(*) FROM ({SESSIONS}) AS x GROUP BY 1, 2, 3
"""
_REACH = f"""
SELECT {{segment}} AS segment, step, h.b, sum(h.n)
FROM {{r}}.funnel_reach AS r CROSS JOIN LATERAL unnest(seconds_buckets, seconds_counts) AS h(b, n) {_PIECES}
GROUP BY 1, 2, 3
UNION ALL
SELECT {{segment}}, step, bucket, count(*) FROM ({REACHES}) AS x GROUP BY 1, 2, 3
"""
_FIRSTS = f"""
SELECT step, min(first_reached_at) FROM {{r}}.funnel_firsts AS r {_PIECES} GROUP BY 1
UNION ALL
SELECT step, min(first_reached_at) FROM ({REACHES}) AS x GROUP BY 1
"""

Path = list[tuple[str, bool, str | None]]


def rollup_funnel(
    conn: Connection[Any],
    reader: str,
    workflow: str,
    *,
    tenant: str,
    steps: Sequence[str] | None,
    by: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[FunnelReport]:
    """``funnel_queries.funnel_report``'s reports from the roll-ups (``by`` None or ``"model"``)."""
    pieces = cover(since or BEGINNING, until)
    rolled = [p for p in pieces if p.grain is not None]
    raw = [p for p in pieces if p.grain is None]
    params = {"tenant": tenant, "workflow": workflow}
    segment = sql.SQL("NULL::text" if by is None else "first_model")  # None: no model, as raw
    names = {
        "segment": segment,
        "r": sql.Identifier(reader),
        "s": sql.Identifier(reader),
        "where": sql.SQL(_RAW).format(raw_where=ranges(raw, "started_at", table="s")),
        "rolled_where": ranges(rolled, "at", table="r"),
        "bucket": sql.SQL(seconds_bucket_sql()),  # type: ignore[arg-type]
    }
    paths: dict[tuple[str | None, str, str], tuple[Path, int]] = {}
    for seg, status, path, count in conn.execute(sql.SQL(_PATHS).format(**names), params):
        key = (seg, status, repr(path))
        paths[key] = ([(p[0], p[1], p[2]) for p in path], paths.get(key, ([], 0))[1] + int(count))
    reach: dict[tuple[str | None, str], list[tuple[int, int]]] = {}
    for seg, step, bucket, count in conn.execute(sql.SQL(_REACH).format(**names), params):
        reach.setdefault((seg, step), []).append((bucket, int(count)))
    firsts: dict[str, datetime] = {}
    for step, first in conn.execute(sql.SQL(_FIRSTS).format(**names), params):
        firsts[step] = min(first, firsts.get(step, first))
    rows = [(seg, status, path, count) for (seg, status, _), (path, count) in paths.items()]
    order = list(steps) if steps else _auto_order(rows, firsts)
    return _reports(workflow, rows, {step: i + 1 for i, step in enumerate(order)}, reach)


def _auto_order(rows: list[tuple[str | None, str, Path, int]], firsts: dict[str, datetime]) -> list[str]:
    """Steps by average position first reached, then earliest reached, then name (as the raw query)."""
    positions: dict[str, list[int]] = {}
    for _, _, path, count in rows:
        for position, (step, _, _) in enumerate(path, start=1):
            total = positions.setdefault(step, [0, 0])
            total[0] += position * count
            total[1] += count
    return sorted(positions, key=lambda s: (Fraction(*positions[s]), firsts[s], s))


def _reports(
    workflow: str,
    rows: list[tuple[str | None, str, Path, int]],
    idx: dict[str, int],
    reach: dict[tuple[str | None, str], list[tuple[int, int]]],
) -> list[FunnelReport]:
    reports: dict[str | None, FunnelReport] = {}
    entries: dict[tuple[str | None, str], FunnelStep] = {}
    previous: dict[tuple[str | None, str], set[str | None]] = {}
    for seg, status, path, count in rows:
        report = reports.setdefault(seg, FunnelReport(workflow, seg))
        report.sessions += count
        furthest: tuple[int, str | None] | None = None
        for position, (step, processed, error) in enumerate(path):
            if step not in idx:
                continue
            entry = entries.setdefault((seg, step), FunnelStep(step))
            entry.reached += count
            entry.processed += count if processed else 0
            previous.setdefault((seg, step), set()).add(path[position - 1][0] if position else None)
            if furthest is None or idx[step] > furthest[0]:
                furthest = (idx[step], step if error is not None else None)
        cause, error_type = _ending(status, furthest, path)
        if furthest is None:
            report.before_first_step[cause] = report.before_first_step.get(cause, 0) + count
        else:
            step = next(s for s in idx if idx[s] == furthest[0])
            _count_ending(entries[seg, step], cause, error_type, count)
    for (seg, step), entry in entries.items():
        entry.p50_seconds, entry.p95_seconds = percentiles(reach.get((seg, step), []), (0.5, 0.95))
        report = reports[seg]
        entry.overall_conversion = entry.reached / report.sessions if report.sessions else 0.0
        came_from = _came_from(rows, seg, previous[seg, step], report.sessions)
        entry.step_conversion = entry.reached / came_from if came_from else 0.0
    for (seg, _), entry in sorted(entries.items(), key=lambda item: idx[item[0][1]]):
        reports[seg].steps.append(entry)
    return sorted(reports.values(), key=lambda r: (r.segment is not None, r.segment or ""))


def _ending(status: str, furthest: tuple[int, str | None] | None, path: Path) -> tuple[str, str | None]:
    """Why a session stopped where it did, and the error type when it failed there."""
    if status == "completed":
        return "completed", None
    if furthest is not None and furthest[1] is not None:
        error = next(e for s, _, e in path if s == furthest[1])
        return "failed", error or None
    if status in ("expired", "abandoned"):
        return status, None
    return "in_progress", None


def _came_from(
    rows: list[tuple[str | None, str, Path, int]], seg: str | None, before: set[str | None], sessions: int
) -> int:
    """Sessions of the segment that reached one of the step's previous steps (all, for a first step)."""
    if None in before:
        return sessions
    return sum(count for s, _, path, count in rows if s == seg and before & {p[0] for p in path})
