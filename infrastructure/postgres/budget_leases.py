"""Leases of engines that saw a tenant without budgets, so that a budget set elsewhere holds for
every call made after its ``set`` returned.

An engine that finds no budget skips its steps' reservations for ``lease_s`` (a second): a
step then pays no query. Without more, a budget another process set in that second charged
none of that engine's calls (an outside probe: a $0.40 step recorded just after the budget's
``PUT`` returned was never charged). So the answer "none" is a lease, written with it
(``probe``), and setting a budget waits out the other engines' leases before it returns
(``leased_for``). One advisory lock per tenant orders the two: a probe holds it shared from
before its read until it commits, a set exclusively from before its own read until it
commits; so either the probe sees the budget, or the set sees the probe's lease.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import Connection, sql

_PROBE = """
WITH found AS (SELECT EXISTS (SELECT 1 FROM {budgets} WHERE tenant = %(tenant)s) AS found_any),
leased AS (
    INSERT INTO {leases} (tenant, holder, until)
    SELECT %(tenant)s, %(holder)s, clock_timestamp() + make_interval(secs => %(seconds)s)
    FROM found WHERE NOT found.found_any
    ON CONFLICT (tenant, holder) DO UPDATE SET until = EXCLUDED.until
),
lapsed AS (
    DELETE FROM {leases}
    WHERE tenant = %(tenant)s AND holder <> %(holder)s AND until < clock_timestamp() - interval '1 minute'
)
SELECT found_any FROM found
"""
"""Whether the tenant has budgets; when not, the holder's lease, and long-lapsed ones dropped."""

_LEASED_FOR = """
SELECT coalesce(extract(epoch FROM max(until) - clock_timestamp()), 0)::float8 FROM {leases}
WHERE tenant = %(tenant)s AND holder IS DISTINCT FROM %(holder)s AND until > clock_timestamp()
"""
"""How long the latest of the other holders' leases still runs, in seconds."""


def lock_tenant(conn: Connection[Any], schema: str, tenant: str, *, shared: bool) -> None:
    """Take the tenant's lock (until the transaction ends): shared to probe, exclusive to set."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    conn.execute(
        sql.SQL("SELECT {}(hashtextextended(%s, 0))").format(sql.Identifier(function)),
        [f"{schema}.budgets-of:{tenant}"],
    )


def probe(
    conn: Connection[Any],
    tables: dict[str, sql.Identifier],
    schema: str,
    tenant: str,
    holder: UUID,
    lease_s: float,
) -> bool:
    """In a transaction of ``conn``: whether ``tenant`` has budgets; when not, ``holder`` is leased
    ``lease_s`` seconds from now by the database's clock, which no earlier than the engine's
    own reading before the probe. The lease needs no flush: only a live server reads it."""
    conn.execute("SELECT set_config('synchronous_commit', 'off', true)")
    lock_tenant(conn, schema, tenant, shared=True)
    query = sql.SQL(_PROBE).format(budgets=tables["budgets"], leases=tables["budget_idle_leases"])
    row = conn.execute(query, {"tenant": tenant, "holder": holder, "seconds": lease_s}).fetchone()
    return bool(row and row[0])


def leased_for(
    conn: Connection[Any], tables: dict[str, sql.Identifier], tenant: str, holder: UUID | None
) -> float:
    """In the set's transaction, after ``lock_tenant`` (exclusive): the seconds the other holders'
    leases on ``tenant`` still run (0 when none does)."""
    query = sql.SQL(_LEASED_FOR).format(leases=tables["budget_idle_leases"])
    row = conn.execute(query, {"tenant": tenant, "holder": holder}).fetchone()
    return float(row[0]) if row else 0.0
