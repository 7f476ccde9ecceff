"""Whether a tenant already holds something in a schema, for names a new tenant may not take.

``domain.tenant_names.require_new_tenant`` narrows the names of new tenants only: a tenant
whose data or keys were stored under a wider name (``'acme '``) must still reach them. So
a name outside the rule is asked about here, and admitted when the schema knows it: a key
made for it (revoked too), a budget, a retention policy, an archived session (its events
left the log), or a session, task or agent it created (the creation events carry the
tenant). The log is scanned for those events; only names outside the rule ever cost that
scan, once per engine and tenant.
"""

from __future__ import annotations

from typing import Any

import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql

from flowledger.domain.agent import Agent
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.tenant_names import new_tenant_refusal
from flowledger.infrastructure.postgres.database import deadlines_of, unavailable_as_store_error
from flowledger.infrastructure.postgres.ddl import TableNames
from flowledger.infrastructure.postgres.retention import BASES, POLICIES
from flowledger.infrastructure.settings import MEMORY_URL, Settings

CREATION_TOPICS = [get_topic(Session.Started), get_topic(Task.Created), get_topic(Agent.Registered)]
"""The events that first store something of a tenant's, each with its ``tenant`` field."""


_BY_COLUMN = "SELECT 1 FROM {} WHERE tenant = %(tenant)s"
_BY_CREATION = (
    "SELECT 1 FROM {} WHERE topic = ANY(%(topics)s)"
    " AND convert_from(state, 'UTF8')::jsonb ->> 'tenant' = %(tenant)s"
)


def tenant_is_known(
    conn: psycopg.Connection[Any], schema: str, tenant: str, *, app_name: str = "flowledger"
) -> bool:
    """Whether ``schema`` holds a key, a budget, a retention policy, an archived session, or a
    session, task or agent of ``tenant`` (a table not made yet holds nothing)."""
    probes = {
        "api_keys": _BY_COLUMN,
        "budgets": _BY_COLUMN,
        POLICIES: _BY_COLUMN,
        BASES: _BY_COLUMN,  # sessions archived: their events left the log
        TableNames.for_app(app_name).events: _BY_CREATION,
    }
    tables = [sql.Identifier(schema, table) for table in probes]
    present = conn.execute(
        "SELECT to_regclass(name) IS NOT NULL"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n) ORDER BY n",
        [[table.as_string(conn) for table in tables]],
    ).fetchall()
    existing = [
        sql.SQL("EXISTS ({})").format(sql.SQL(probe).format(table))
        for (probe, table, (there,)) in zip(probes.values(), tables, present, strict=True)
        if there
    ]
    if not existing:
        return False
    row = conn.execute(
        sql.SQL("SELECT ") + sql.SQL(" OR ").join(existing), {"tenant": tenant, "topics": CREATION_TOPICS}
    ).fetchone()
    return bool(row and row[0])


def admit_tenant(conn: psycopg.Connection[Any], schema: str, tenant: str) -> None:
    """Raise the rule's ValidationError if ``tenant`` may not name a new tenant and ``schema``
    does not know it already (``tenant_is_known``); a name inside the rule costs no query."""
    refusal = new_tenant_refusal(tenant)
    if refusal is not None and not tenant_is_known(conn, schema, tenant):
        raise refusal


def admit_engine_tenant(database_url: str, settings: Settings) -> None:
    """Refuse an engine for ``settings.tenant`` if that name may not name a new tenant and the
    schema holds nothing of it (an in-memory store, fresh, holds nothing); unreachable: the
    store's ``StoreUnavailable``."""
    refusal = new_tenant_refusal(settings.tenant)
    if refusal is None:
        return
    if database_url == MEMORY_URL:
        raise refusal
    with (
        unavailable_as_store_error("start"),
        psycopg.connect(database_url, autocommit=True, **deadlines_of(settings).connection_kwargs()) as conn,
    ):
        admit_tenant(conn, settings.schema, settings.tenant)
