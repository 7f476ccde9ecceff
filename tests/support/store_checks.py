"""Checks read straight from the events table, without the engine's help: steps per idempotency
key, sessions and tasks per id, every agent's load at every version, versions missing from a
stream, and whether the
followers' projections equal a rebuild from the log."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for, status, verify

EVENTS_TABLE = "flowledger_events"


def _rows(database_url: str, schema: str, topic_like: str, field: str) -> list[tuple[Any, ...]]:
    """(originator id, version, state[field]) of every event whose topic ends like ``topic_like``."""
    query = sql.SQL(
        "SELECT originator_id, originator_version, convert_from(state, 'UTF8')::jsonb -> %s"
        " FROM {}.{} WHERE topic LIKE %s ORDER BY originator_id, originator_version"
    ).format(sql.Identifier(schema), sql.Identifier(EVENTS_TABLE))
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(query, (field, "%" + topic_like)).fetchall()


def count_by_field(database_url: str, schema: str, topic_like: str, field: str) -> Counter[str]:
    """How many stored events of the topic carry each value of ``field``."""
    return Counter(str(value) for _, _, value in _rows(database_url, schema, topic_like, field))


@dataclass(frozen=True)
class Tally:
    """What the load generator was told was done, against what the log holds."""

    kind: str
    acknowledged: int
    stored: int
    lost: int
    """Acknowledged but not in the log."""
    doubled: int
    """In the log more than once."""

    def line(self) -> str:
        """One line for a report."""
        return (
            f"{self.kind}: acknowledged={self.acknowledged} stored={self.stored}"
            f" lost={self.lost} doubled={self.doubled}"
        )


def tally(kind: str, acknowledged: Iterable[str], stored: Counter[str]) -> Tally:
    """Compare acknowledged ids (idempotency keys, session or task ids) with the stored counts."""
    acked = set(acknowledged)
    return Tally(
        kind,
        len(acked),
        sum(stored.values()),
        sum(1 for key in acked if stored[key] == 0),
        sum(1 for count in stored.values() if count > 1),
    )


def step_tally(database_url: str, schema: str, acknowledged: Iterable[str]) -> Tally:
    """Steps: one ``StepProcessed`` per acknowledged idempotency key, never two for one key."""
    stored = count_by_field(database_url, schema, "Session.StepProcessed", "idempotency_key")
    return tally("steps", acknowledged, stored)


def session_tally(database_url: str, schema: str, acknowledged: Iterable[str]) -> Tally:
    """Sessions: one ``Started`` per acknowledged session id."""
    stored = count_by_field(database_url, schema, "Session.Started", "session_id")
    return tally("sessions", acknowledged, stored)


def task_tally(database_url: str, schema: str, acknowledged: Iterable[str]) -> Tally:
    """Tasks: one ``Created`` per acknowledged task id."""
    stored = count_by_field(database_url, schema, "Task.Created", "task_id")
    return tally("tasks", acknowledged, stored)


def version_gaps(database_url: str, schema: str) -> list[str]:
    """Every stream whose stored versions are not 1, 2, 3, ... with none missing: the stream's
    id, its topic there and each version that follows a missing one (as ``after..found``).
    Such a stream no longer loads (``OriginatorVersionError``)."""
    query = sql.SQL(
        "SELECT originator_id, topic, previous, originator_version FROM ("
        " SELECT originator_id, topic, originator_version,"
        " lag(originator_version, 1, 0) OVER (PARTITION BY originator_id ORDER BY originator_version)"
        " AS previous FROM {}.{}) AS versions"
        " WHERE originator_version <> previous + 1 ORDER BY originator_id, originator_version"
    ).format(sql.Identifier(schema), sql.Identifier(EVENTS_TABLE))
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(query).fetchall()
    return [
        f"{stream} {topic.rsplit(':', 1)[-1]} v{previous}..v{found}"
        for stream, topic, previous, found in rows
    ]


@dataclass(frozen=True)
class AgentLoads:
    """Every agent's load folded from its events: the highest it reached, against its capacity."""

    peak: dict[str, int]
    capacity: dict[str, int]
    final: dict[str, int]
    accepted: int
    """TaskAccepted events in all."""
    overloaded: list[str]
    """Agents whose load passed their capacity at some version."""
    overload_details: list[str]
    """For each such agent, the first version over capacity and the tasks it then held."""


def agent_loads(database_url: str, schema: str) -> AgentLoads:
    """Fold each agent's Registered, CapacityChanged, TaskAccepted and TaskReleased events in
    version order and check load <= capacity after every one."""
    query = sql.SQL(
        "SELECT originator_id, originator_version, topic, convert_from(state, 'UTF8')::jsonb"
        " FROM {}.{} WHERE topic LIKE %s ORDER BY originator_id, originator_version"
    ).format(sql.Identifier(schema), sql.Identifier(EVENTS_TABLE))
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(query, ("%Agent.%",)).fetchall()
    names: dict[Any, str] = {}
    load: defaultdict[str, int] = defaultdict(int)
    peak: defaultdict[str, int] = defaultdict(int)
    capacity: dict[str, int] = {}
    overloaded: set[str] = set()
    holders: dict[str, str] = {}
    details: list[str] = []
    accepted = 0
    for originator, _version, topic, state in rows:
        kind = topic.rsplit(".", 1)[-1]
        if kind == "Registered":
            names[originator] = state["agent_id"]
            capacity[state["agent_id"]] = int(state["capacity"])
        agent = names.get(originator, str(originator))
        if kind == "CapacityChanged":
            capacity[agent] = int(state["capacity"])
        elif kind == "TaskAccepted":
            load[agent] += 1
            accepted += 1
            holders[state["task_id"]] = agent
        elif kind == "TaskReleased":
            load[agent] -= 1
            holders.pop(state["task_id"], None)
        peak[agent] = max(peak[agent], load[agent])
        if load[agent] > capacity.get(agent, 0) and agent not in overloaded:
            overloaded.add(agent)
            held = sorted(h for h, holder in holders.items() if holder == agent)
            details.append(
                f"{agent} v{_version}: load {load[agent]} > {capacity.get(agent, 0)}, holding {held}"
            )
    return AgentLoads(dict(peak), capacity, dict(load), accepted, sorted(overloaded), details)


def wait_for_followers(engine: Engine, timeout_s: float = 60.0) -> float:
    """Wait until every live projection build has applied every event of its topics in the
    log (the followers' work alone: nothing here drives the builds); seconds waited.

    TimeoutError if they do not get there in ``timeout_s``.
    """
    projector = projector_for(engine)
    projections = {p.name: p for p in projector.select(None)}
    names = projector.names
    query = sql.SQL("SELECT max(notification_id) FROM {}.{} WHERE topic = ANY(%s)").format(
        sql.Identifier(names.store), sql.Identifier(EVENTS_TABLE)
    )
    began = time.monotonic()
    while True:
        behind = []
        with psycopg.connect(engine.database_url, autocommit=True, connect_timeout=10) as conn:
            for build in status(projector):
                if build.state != "live":
                    continue
                topics = sorted(projections[build.projection].topics)
                row = conn.execute(query, (topics,)).fetchone()
                last = int(row[0]) if row and row[0] is not None else 0
                if build.position < last:
                    behind.append(f"{build.projection} at {build.position} of {last}")
        if not behind:
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"followers still behind after {timeout_s:.0f} s: {', '.join(behind)}")
        time.sleep(0.2)


def projection_differences(engine: Engine) -> list[str]:
    """The live projections against a rebuild from the log into a scratch schema (``verify``)."""
    return [
        f"{d.projection}.{d.table} {d.side}: {d.row}" for d in verify(projector_for(engine, batch_size=5000))
    ]


def caught_up_dashboard(engine: Engine, **query: Any) -> list[Any]:
    """``engine``'s tenant's cost dashboard (``projections.dashboard`` with ``query``: since, by,
    read...) once the projections have caught up with the log."""
    projector = projector_for(engine)
    projector.catch_up()
    with projector.connect_reader() as conn:
        return dashboard(conn, projector.names.reader, tenant=engine.tenant, **query)


def dead_letter_counts(projector: Any) -> dict[str, int]:
    """Each live build's count of events it set aside (``projections status``), by projection."""
    return {build.projection: build.dead_letters for build in status(projector)}
