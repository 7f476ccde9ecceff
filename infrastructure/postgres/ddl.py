"""The DDL ``migrate`` runs: the tables the event library expects, and the version row.

The snapshot and tracking tables are the library's own definitions (same names, columns
and storage options), so its recorders work on them unchanged; the events table and its
append functions are flowledger's (``sql.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg.sql import SQL, Composed, Identifier, Literal

from flowledger.infrastructure.postgres import sequence_repairs
from flowledger.infrastructure.postgres.retention import GUARD
from flowledger.infrastructure.postgres.sql import section_lock_key

VERSION_TABLE = "flowledger_schema"
MAX_IDENTIFIER_LEN = 63

# The library's storage options for its tables: autovacuum tuned for append-only tables.
_STORAGE = SQL(
    " WITH (autovacuum_enabled = true, autovacuum_vacuum_threshold = 100000000, "
    "autovacuum_vacuum_scale_factor = 0.5, autovacuum_analyze_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.01)"
)


@dataclass(frozen=True)
class TableNames:
    """The tables of one library application, named as ``PostgresFactory`` names them."""

    events: str
    snapshots: str
    tracking: str

    @property
    def checkpoints(self) -> str:
        """Signed checkpoints of the events table (docs/audit.md)."""
        return f"{self.events.removesuffix('_events')}_checkpoints"

    @property
    def chain_upgrades(self) -> str:
        """What each ``flowledger audit chain`` chained after the fact."""
        return f"{self.events.removesuffix('_events')}_chain_upgrades"

    @classmethod
    def for_app(cls, app_name: str) -> TableNames:
        """``<app>_events``, ``<app>_snapshots``, ``<app>_tracking`` (lower case)."""
        prefix = app_name.lower()
        return cls(f"{prefix}_events", f"{prefix}_snapshots", f"{prefix}_tracking")


def append_function_name(events_table: str) -> str:
    """The append function's name for an events table (the recorder calls it)."""
    return f"{events_table}_append"[:MAX_IDENTIFIER_LEN]


def migration_lock_key(schema: str) -> int:
    """The advisory-lock key every ``migrate`` of ``schema`` takes (differs from the append's)."""
    digest = hashlib.blake2b(f"flowledger-migrate:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# NULL where the role may not read the control data (some managed services): the
# last-row check still runs at every start; only the whole-table check is lost.
_CLUSTER_ID = SQL(
    "(CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE') "
    "THEN (SELECT system_identifier::text FROM pg_control_system()) END)"
)


def create_version_table(schema: str) -> Composed:
    """One row: the schema version, and the cluster that last checked the log's ids."""
    return SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} ("
        "singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton), "
        "version integer NOT NULL, "
        "cluster_id text, "
        "migrated_at timestamptz NOT NULL DEFAULT now())"
    ).format(Identifier(schema), Identifier(VERSION_TABLE))


def read_version(schema: str) -> Composed:
    """The version row's version (no row: a new schema)."""
    return SQL("SELECT version FROM {}.{}").format(Identifier(schema), Identifier(VERSION_TABLE))


def record_version(schema: str) -> Composed:
    """Upsert the version (parameter) with this cluster's identity."""
    return SQL(
        "INSERT INTO {s}.{t} (singleton, version, cluster_id, migrated_at) "
        "VALUES (true, %s, {cluster}, now()) "
        "ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version, "
        "cluster_id = EXCLUDED.cluster_id, migrated_at = EXCLUDED.migrated_at"
    ).format(s=Identifier(schema), t=Identifier(VERSION_TABLE), cluster=_CLUSTER_ID)


def fast_check(schema: str, names: TableNames) -> Composed:
    """Version, recorded and current cluster, the sequence's cache, whether the last row is
    foreign, and the events table's layout (``event_log_layout``).

    Only the last row (by id, through the unique index): in a log written here the
    transaction ids grow with the ids. A whole scan runs only when the cluster changed.
    """
    events = SQL("{}.{}").format(Identifier(schema), Identifier(names.events))
    return SQL(
        "SELECT v.version, v.cluster_id, "
        "{cluster}, "
        "(SELECT seqcache FROM pg_sequence "
        "WHERE seqrelid = pg_get_serial_sequence({qualified}, 'notification_id')::regclass), "
        "(SELECT e.transaction_id >= pg_snapshot_xmax(pg_current_snapshot()) FROM {events} e "
        "ORDER BY e.notification_id DESC LIMIT 1), "
        "{layout}, "
        "{out_of_order}, "
        "{indexes_missing}, "
        "{functions_stale} "
        "FROM {s}.{t} v"
    ).format(
        functions_stale=functions_stale(schema, names.events),
        layout=event_log_layout(Literal(events.as_string(None))),
        indexes_missing=log_indexes_missing(Literal(events.as_string(None))),
        out_of_order=sequence_out_of_order(events),
        qualified=Literal(events.as_string(None)),
        events=events,
        s=Identifier(schema),
        t=Identifier(VERSION_TABLE),
        cluster=_CLUSTER_ID,
    )


def functions_stale(schema: str, table: str) -> Composed:
    """Whether the append functions are missing, or (with retention's guard) name another
    schema in their bodies: the schema was renamed (or restored under another name), and the
    functions still take the old name's sequence, table and id-section lock."""
    function = append_function_name(table)
    return SQL(
        "((SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
        "(SELECT oid FROM pg_namespace WHERE nspname = {schema}) "
        "AND p.proname IN ({one}, {many}) AND strpos(p.prosrc, {key}) > 0) < 2 OR EXISTS ("
        "SELECT 1 FROM pg_proc p WHERE p.pronamespace = "
        "(SELECT oid FROM pg_namespace WHERE nspname = {schema}) "
        "AND p.proname = {guard} AND strpos(p.prosrc, {qualified}) = 0))"
    ).format(
        schema=Literal(schema),
        one=Literal(f"{function}_one"[:MAX_IDENTIFIER_LEN]),
        many=Literal(function),
        key=Literal(str(section_lock_key(schema, table))),
        guard=Literal(GUARD),
        qualified=Literal(Identifier(schema).as_string(None) + "."),
    )


def log_indexes_missing(qualified_table: Literal) -> Composed:
    """Whether the events table lacks a valid primary key (a stream's version stored once) or a
    valid unique index led by ``notification_id`` (an id taken once; readers page through it)."""
    return SQL(
        "(NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass({q}) "
        "AND i.indisprimary AND i.indisvalid) OR "
        "NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
        "WHERE i.indrelid = to_regclass({q}) AND i.indisunique AND i.indisvalid "
        "AND a.attname = 'notification_id'))"
    ).format(q=qualified_table)


def primary_key_name(table: str) -> str:
    """The events table's primary key constraint, as PostgreSQL names it."""
    return f"{table}_pkey"[:MAX_IDENTIFIER_LEN]


def notification_index_name(table: str) -> str:
    """The unique index on notification ids (``create_notification_index``)."""
    return f"{table}_notification_id_idx"[:MAX_IDENTIFIER_LEN]


def sequence_out_of_order(events: Composed) -> Composed:
    """Whether the notification sequence of ``events`` may hand out an id at or below a stored
    one: it counts down or cycles, stops short of bigint's end, or was set back below the
    highest stored id (the last check only where the role may read the sequence)."""
    qualified = Literal(events.as_string(None))
    return SQL(
        "(SELECT s.seqincrement < 1 OR s.seqcycle OR s.seqmax < 9223372036854775807 OR "
        "(CASE WHEN has_sequence_privilege(s.seqrelid, 'SELECT,USAGE') THEN "
        "coalesce(pg_sequence_last_value(s.seqrelid), 0) < "
        "coalesce((SELECT e.notification_id FROM {events} e ORDER BY e.notification_id DESC LIMIT 1), 0) "
        "ELSE false END) "
        "FROM pg_sequence s "
        "WHERE s.seqrelid = pg_get_serial_sequence({qualified}, 'notification_id')::regclass)"
    ).format(events=events, qualified=qualified)


def repair_foreign_transaction_ids(schema: str, table: str) -> Composed:
    """Rows whose transaction id is at or past this statement's snapshot xmax, set to 0."""
    return SQL(
        "UPDATE {}.{} SET transaction_id = '0' "
        "WHERE transaction_id >= pg_snapshot_xmax(pg_current_snapshot())"
    ).format(Identifier(schema), Identifier(table))


def create_notification_index(schema: str, table: str, *, partitioned: bool = False) -> Composed:
    """The library's unique index on notification ids (readers page through it).

    A unique index on a partitioned table must hold the partition key: there it is
    ``(notification_id, originator_id)``, which still serves ``ORDER BY notification_id``
    (each partition's index scanned in order, merged). An id stays unique all the same:
    only the append functions write the log, and they take every id from one sequence.
    """
    columns = SQL("notification_id ASC, originator_id") if partitioned else SQL("notification_id ASC")
    return SQL("CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {s}.{t} ({columns})").format(
        index=Identifier(notification_index_name(table)),
        s=Identifier(schema),
        t=Identifier(table),
        columns=columns,
    )


def event_log_layout(qualified_table: Literal) -> Composed:
    """The events table's layout: NULL (no table), 0 (unpartitioned) or its number of partitions."""
    return SQL(
        "(SELECT CASE WHEN c.relkind = 'p' THEN "
        "(SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) ELSE 0 END "
        "FROM pg_class c WHERE c.oid = to_regclass({}))"
    ).format(qualified_table)


def create_other_tables(schema: str, names: TableNames, id_type: str) -> list[Composed]:
    """The library's composite type (its snapshot insert casts to it), snapshots and tracking."""
    s = Identifier(schema)
    type_name = f"stored_event_{id_type}"
    create_type = SQL(
        "DO $$ BEGIN IF to_regtype({qualified}) IS NULL THEN "
        "CREATE TYPE {s}.{name} AS (originator_id {id_type}, originator_version bigint, "
        "topic text, state bytea); END IF; END $$"
    ).format(
        qualified=Literal(SQL("{}.{}").format(s, Identifier(type_name)).as_string(None)),
        s=s,
        name=Identifier(type_name),
        id_type=Identifier(id_type),
    )
    snapshots = (
        SQL(
            "CREATE TABLE IF NOT EXISTS {s}.{t} (originator_id {id_type} NOT NULL, "
            "originator_version bigint NOT NULL, topic text, state bytea, "
            "PRIMARY KEY (originator_id, originator_version))"
        ).format(s=s, t=Identifier(names.snapshots), id_type=Identifier(id_type))
        + _STORAGE
    )
    tracking = (
        SQL(
            "CREATE TABLE IF NOT EXISTS {s}.{t} (application_name text, notification_id bigint, "
            "PRIMARY KEY (application_name))"
        ).format(s=s, t=Identifier(names.tracking))
        + _STORAGE
    )
    # The library marks a single-row tracking table it made with this row; without it,
    # its own create_table (if ever run) would take the table for a legacy one and rename it.
    migration_row = SQL(
        "INSERT INTO {s}.{t} VALUES ('__migration__', 1) ON CONFLICT (application_name) DO NOTHING"
    ).format(s=s, t=Identifier(names.tracking))
    return [create_type, snapshots, tracking, migration_row]


def create_audit_tables(schema: str, names: TableNames) -> list[Composed]:
    """Signed checkpoints, the record of rows chained after they were written, and of rows found
    past the id sequence when it was set forward (``sequence_repairs.py``).

    A checkpoint row holds its signed statement (canonical JSON), the signature, and the
    stream heads that changed since the checkpoint before (``heads``: packed, compressed);
    the statement's Merkle root covers every head, so an edited row fails to verify.
    """
    s = Identifier(schema)
    return [
        SQL(
            "CREATE TABLE IF NOT EXISTS {s}.{t} (seq bigint PRIMARY KEY, position bigint NOT NULL, "
            "statement bytea NOT NULL, signature bytea NOT NULL, heads bytea NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        ).format(s=s, t=Identifier(names.checkpoints)),
        SQL(
            "CREATE TABLE IF NOT EXISTS {s}.{t} (upgraded_at timestamptz NOT NULL DEFAULT now(), "
            "through_position bigint NOT NULL, rows bigint NOT NULL)"
        ).format(s=s, t=Identifier(names.chain_upgrades)),
        sequence_repairs.create_table(schema, names.events),
    ]


_BUDGET_TABLES = """
CREATE TABLE IF NOT EXISTS {s}.budgets (
    budget_id uuid PRIMARY KEY,
    tenant text NOT NULL,
    scope text NOT NULL,
    subject text NOT NULL,
    period text NOT NULL,
    limit_usd numeric NOT NULL CHECK (limit_usd > 0),
    mode text NOT NULL CHECK (mode IN ('enforce', 'alert')),
    webhook_url text,
    webhook_secret text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS budgets_by_tenant ON {s}.budgets (tenant, scope, subject);
CREATE TABLE IF NOT EXISTS {s}.budget_windows (
    budget_id uuid NOT NULL REFERENCES {s}.budgets ON DELETE CASCADE,
    window_start timestamptz NOT NULL,
    spent_usd numeric NOT NULL DEFAULT 0,
    reserved_usd numeric NOT NULL DEFAULT 0,
    alerted integer[] NOT NULL DEFAULT '{{}}',
    PRIMARY KEY (budget_id, window_start)
);
CREATE TABLE IF NOT EXISTS {s}.budget_reservations (
    reservation_id uuid NOT NULL,
    budget_id uuid NOT NULL,
    window_start timestamptz NOT NULL,
    amount_usd numeric NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (reservation_id, budget_id),
    FOREIGN KEY (budget_id, window_start) REFERENCES {s}.budget_windows ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS budget_reservations_by_window
    ON {s}.budget_reservations (budget_id, window_start, expires_at);
CREATE TABLE IF NOT EXISTS {s}.budget_charges (
    charge_id uuid PRIMARY KEY,
    charged_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.budget_idle_leases (
    tenant text NOT NULL,
    holder uuid NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (tenant, holder)
);
"""


def create_budget_tables(schema: str) -> list[Composed]:
    """The budget ledger's tables: terms, windows, reservations, charges and the leases of engines
    that saw a tenant without budgets (``postgres/budgets.py``)."""
    return [SQL(_BUDGET_TABLES).format(s=Identifier(schema))]
