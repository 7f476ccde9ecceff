"""Schema creation, upgrades and the event log's invariants: once per database, under a lock.

Every engine used to run the library's ``CREATE TABLE`` DDL at start; 12 of 48 engines
started at once failed with ``tuple concurrently updated``. Now the library runs no DDL
(``CREATE_TABLE=n``, see ``database.library_env``) and ``migrate`` does it all in one
transaction holding a transaction-level advisory lock. A version row in
``<schema>.flowledger_schema`` lets every later start skip the lock with one read.

At every start (the check is that same read) ``migrate`` also enforces two invariants
the readers depend on, found by experiment (issue 11, item 8):

- the notification-id sequence has ``CACHE 1``: with ``CACHE 10`` and two writers a
  reader consumed ids 1, 11, 12 and never delivered 2, committed later;
- no row carries a ``transaction_id`` this cluster has not issued yet: after
  ``pg_dump``/restore into a younger cluster readers stall (rows never pass the horizon).

The events table's layout (one table, or hash partitions by stream: ``Settings.event_partitions``)
is read from the catalog, not versioned: both layouts are valid at every version, and the same
code reads and appends to either. A new schema is made in the configured layout; an existing
log is converted (``change_layout``) only when asked (``flowledger migrate``), never at an
engine's start, as the conversion copies every row under an exclusive lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import monotonic, sleep
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier, Literal

from flowledger.domain.errors import LogDamaged, MigrationRefused, ValidationError
from flowledger.infrastructure.postgres import data_keys, ddl, retention, sequence_repairs
from flowledger.infrastructure.postgres import sql as pg_sql
from flowledger.infrastructure.postgres.connect_within import connect_within
from flowledger.infrastructure.settings import Settings

SCHEMA_VERSION = 9
"""1: events (with transaction_id), snapshots, tracking, append functions that unlock on failure.
2: the append functions hold an in-flight marker lock until they commit (readers' horizon).
3: the audit chain: each event's hash and keyed seal (``event_hash``, ``event_mac``), appended
with it; signed checkpoints and the record of ``audit chain`` upgrades (docs/audit.md).
4: the data-key table of sealed personal fields (``data_keys.py``).
5: the budget ledger's tables (``budgets.py``), which the ledger made at first use before:
inside a step, which every writer of a new engine waited for (bench/README.md, issue 11).
6: the append functions refuse an id handed out from a sequence cache (``sql.ID_FROM_SEQUENCE_CACHE``).
7: the append functions unlock the id section inside its exception block (a cancel at the unlock
left the lock held).
8: ``budget_idle_leases``: an engine that saw a tenant without budgets skips its reservations for
a second; a budget set elsewhere waits that out (``budgets.py``).
9: ``<app>_sequence_repairs``: the rows found past the id sequence when it was set forward
(``sequence_repairs.py``), which ``audit verify`` names."""

MARKERS_SINCE = 2
"""The first version whose appends hold in-flight markers: upgrading from before waits for
appends still running the old functions (readers cannot see those)."""

MIGRATION_STATEMENT_TIMEOUT_S = 120.0
"""A repair rewrites rows: allow it longer than an ordinary statement."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class MigrationReport:
    """What one ``migrate`` call found and did."""

    schema: str
    version: int
    locked: bool
    """False when the version row and both invariants were already right (no lock taken)."""
    created: bool
    """The DDL ran (a new schema, or an upgrade from an older version)."""
    sequence_cache_reset: bool
    foreign_rows_repaired: int
    partitions: int = 0
    """The events table's layout afterwards: its hash partitions (0: unpartitioned)."""
    rows_moved: int | None = None
    """Rows copied into a new layout (``change_layout``); None when the layout was not changed."""
    sequence_repairs: tuple[str, ...] = ()
    """What ``repair_sequence_order`` changed in the notification sequence (nothing: empty)."""
    indexes_made: tuple[str, ...] = ()
    """The events table's unique indexes made again (``restore_log_indexes``)."""
    functions_remade: bool = False
    """The append functions (and retention's guard) were made again for this schema's name
    (``remake_stale_functions``: a renamed schema's still named the old one)."""


def migrate(
    database_url: str,
    schema: str,
    settings: Settings | None = None,
    *,
    app_name: str = "flowledger",
    originator_id_type: str = "uuid",
    change_layout: bool = True,
) -> MigrationReport:
    """Bring ``schema`` to ``SCHEMA_VERSION`` and enforce the log's invariants; safe to run at once
    from any number of processes. Tables are named after ``app_name`` as the library names them.

    A new events table is made with ``settings.event_partitions`` hash partitions (None: 0, one
    table). An existing one in another layout is converted when that is set and
    ``change_layout`` (``flowledger migrate``); without it (an engine's start) the layout is
    left as it is, with a warning; with the setting None it is left as it is."""
    settings = settings or Settings()
    names = ddl.TableNames.for_app(app_name)
    with connect_within(database_url, settings.connect_deadline_s, autocommit=True) as conn:
        version, layout = _already_right(conn, schema, names, settings) or (SCHEMA_VERSION, None)
        wanted = layout if settings.event_partitions is None else settings.event_partitions
        if layout is not None and (layout == wanted or not change_layout):
            if wanted is not None and layout != wanted:
                _warn_layout(schema, names.events, layout, wanted)
            if version > SCHEMA_VERSION:
                _warn_newer(schema, version)
            return MigrationReport(
                schema=schema,
                version=version,
                locked=False,
                created=False,
                sequence_cache_reset=False,
                foreign_rows_repaired=0,
                partitions=layout,
            )
        try:
            with conn.transaction():
                report, upgraded = _migrate_locked(
                    conn, schema, names, originator_id_type, settings, change_layout=change_layout
                )
        except psycopg.errors.InsufficientPrivilege as error:
            reason = str(error).strip().splitlines()[0]
            raise MigrationRefused(
                schema, f"{reason}; run `flowledger migrate` as the schema's owner"
            ) from error
        if upgraded:
            _wait_for_unmarked_appends(conn, schema, names.events, settings)
        return report


def _warn_newer(schema: str, version: int) -> None:
    _log.warning("schema %s is at version %s, newer than this code's %s", schema, version, SCHEMA_VERSION)


def _warn_layout(schema: str, table: str, layout: int, wanted: int) -> None:
    _log.warning(
        "%s.%s has %s; FLOWLEDGER_EVENT_PARTITIONS asks for %s: run `flowledger migrate` to convert it",
        schema,
        table,
        _layout_words(layout),
        _layout_words(wanted),
    )


def _layout_words(partitions: int) -> str:
    return f"{partitions} hash partitions" if partitions else "no partitions"


def _already_right(
    conn: psycopg.Connection[Any], schema: str, names: ddl.TableNames, settings: Settings
) -> tuple[int, int] | None:
    """One read, no lock: the version and the events table's layout when the version is
    current (or newer: a later flowledger migrated it), the cluster unchanged and both
    invariants hold; else None (the locked migration must run).

    A newer version used to count as not right: every engine of the older code (a rolling
    upgrade's) took the migration lock at its start and rewrote the version row."""
    try:
        # SET LOCAL, not a session SET or a startup option: both would misbehave behind PgBouncer.
        with conn.transaction():
            conn.execute(
                SQL("SET LOCAL statement_timeout = {}").format(int(settings.statement_timeout_s * 1000))
            )
            row = conn.execute(ddl.fast_check(schema, names)).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedObject):
        return None
    if row is None:
        return None
    version, cluster, cluster_now, cache, foreign_tail, layout, out_of_order, indexes_missing, stale = row
    right = (
        not stale
        and version >= SCHEMA_VERSION
        and cluster == cluster_now
        and cache == 1
        and not foreign_tail
        and not out_of_order
        and not indexes_missing
    )
    return (int(version), int(layout)) if right and layout is not None else None


def _migrate_locked(
    conn: psycopg.Connection[Any],
    schema: str,
    names: ddl.TableNames,
    id_type: str,
    settings: Settings,
    *,
    change_layout: bool,
) -> tuple[MigrationReport, bool]:
    """The migration, and whether it replaced append functions that took no markers."""
    timeout_ms = int(max(MIGRATION_STATEMENT_TIMEOUT_S, settings.statement_timeout_s) * 1000)
    cur = conn.cursor(row_factory=tuple_row)
    cur.execute(SQL("SET LOCAL statement_timeout = {}").format(timeout_ms))
    # Transaction-level: released by COMMIT or ROLLBACK whatever happens, and never
    # held on a pooled connection (this one is our own).
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (ddl.migration_lock_key(schema),))
    _create_schema_and_version_table(cur, schema)
    row = cur.execute(ddl.read_version(schema)).fetchone()
    version = 0 if row is None else int(row[0])
    if version and event_log_partitions(cur, schema, names.events) is None:
        # Made anew, the log would start again at id 1 beside projections, checkpoints and
        # followers' positions that say otherwise, and hide the loss.
        raise LogDamaged(
            "",
            0,
            f"{schema}.{names.events} is missing while {schema}.{ddl.VERSION_TABLE} records version"
            f" {version}: the log was dropped in the database; restore it from a backup, or drop"
            " the schema to start a new log",
        )
    created = version < SCHEMA_VERSION
    if created:
        create_event_log(cur, schema, names.events, id_type, partitions=settings.event_partitions or 0)
        for statement in ddl.create_other_tables(schema, names, id_type):
            cur.execute(statement)
        for statement in ddl.create_audit_tables(schema, names):
            cur.execute(statement)
        for statement in data_keys.create_table(schema):
            cur.execute(statement)
        for statement in ddl.create_budget_tables(schema):
            cur.execute(statement)
    elif version > SCHEMA_VERSION:
        _warn_newer(schema, version)
    remade = not created and remake_stale_functions(cur, schema, names.events, id_type)
    cache_reset = force_sequence_cache_1(cur, schema, names.events)
    indexes_made = restore_log_indexes(cur, schema, names.events)
    sequence_repairs = repair_sequence_order(cur, schema, names.events)
    repaired = _repair_foreign_transaction_ids(cur, schema, names.events)
    layout = event_log_partitions(cur, schema, names.events) or 0
    wanted = settings.event_partitions
    moved: int | None = None
    if wanted is not None and layout != wanted:
        if change_layout:
            moved = change_event_log_layout(cur, schema, names.events, id_type, wanted, settings)
            layout = wanted
        else:
            _warn_layout(schema, names.events, layout, wanted)
    cur.execute(ddl.record_version(schema), (max(version, SCHEMA_VERSION),))
    report = MigrationReport(
        schema=schema,
        version=max(version, SCHEMA_VERSION),
        locked=True,
        created=created,
        sequence_cache_reset=cache_reset,
        foreign_rows_repaired=repaired,
        partitions=layout,
        rows_moved=moved,
        sequence_repairs=sequence_repairs,
        indexes_made=indexes_made,
        functions_remade=remade,
    )
    return report, 0 < version < MARKERS_SINCE


def _create_schema_and_version_table(cur: psycopg.Cursor[Any], schema: str) -> None:
    """Create the schema and its version table if missing, and only then: ``CREATE ... IF NOT
    EXISTS`` needs the privilege to create even where the object exists, which a role that only
    reads and writes the log has not (``permission denied for database``)."""
    if cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        cur.execute(SQL("CREATE SCHEMA {}").format(Identifier(schema)))
    table = SQL("{}.{}").format(Identifier(schema), Identifier(ddl.VERSION_TABLE)).as_string(cur)
    found = cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not (found and found[0]):
        cur.execute(ddl.create_version_table(schema))


def _wait_for_unmarked_appends(
    conn: psycopg.Connection[Any], schema: str, table: str, settings: Settings
) -> None:
    """After new append functions with markers committed: wait (at most a statement timeout) for
    the transactions that may have appended with the old ones, which new readers cannot see.

    Those are the transactions holding the log's sequence (``nextval`` locks it until the
    transaction ends) and any statement of this database already running (a call of the
    old function that has not reached ``nextval`` yet). Every later call runs the new
    functions. An unrelated statement running then only makes this upgrade wait longer.
    """
    sequence = _sequence_of(conn.cursor(), schema, table)
    deadline = monotonic() + settings.statement_timeout_s
    rows = conn.execute(_APPENDING_NOW, (sequence,)).fetchall()
    pending = [str(row[0]) for row in rows]
    while pending:
        if monotonic() >= deadline:
            _log.warning(
                "%s transactions that may have appended to %s.%s with the old functions are still "
                "open; a reader could pass their ids if they commit later",
                len(pending),
                schema,
                table,
            )
            return
        sleep(0.01)
        rows = conn.execute(
            "SELECT DISTINCT virtualtransaction FROM pg_locks WHERE virtualtransaction = ANY(%s)", (pending,)
        ).fetchall()
        pending = [str(row[0]) for row in rows]


_APPENDING_NOW = (
    "SELECT DISTINCT l.virtualtransaction FROM pg_locks l "
    "CROSS JOIN (SELECT oid FROM pg_database WHERE datname = current_database()) AS d "
    "WHERE l.pid <> pg_backend_pid() AND ("
    "(l.locktype = 'relation' AND l.database = d.oid AND l.relation = %s::regclass) "
    "OR (l.locktype = 'virtualxid' AND l.pid IN (SELECT a.pid FROM pg_stat_activity a "
    "WHERE a.datid = d.oid AND a.state = 'active' AND a.pid <> pg_backend_pid())))"
)


def create_event_log(
    cur: psycopg.Cursor[Any], schema: str, table: str, id_type: str, *, partitions: int = 0
) -> None:
    """The events table (made in the ``partitions`` layout, or upgraded in place in the layout
    it has) and its append functions (replaced)."""
    cur = cur.connection.cursor(row_factory=tuple_row)  # same transaction, rows by position
    layout = event_log_partitions(cur, schema, table)
    if layout is None:
        for statement in pg_sql.create_table(schema, table, id_type, partitions=partitions):
            cur.execute(statement)
        layout = partitions
    has_transaction_id = cur.execute(
        "SELECT 1 FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s AND column_name = 'transaction_id'",
        (schema, table),
    ).fetchone()
    if has_transaction_id is None:  # a table the library's stock recorder made
        for statement in pg_sql.add_transaction_id(schema, table):
            cur.execute(statement)
    for statement in pg_sql.add_chain_columns(schema, table):
        cur.execute(statement)
    for statement in pg_sql.drop_unchained_append_functions(
        schema=schema, function=ddl.append_function_name(table), id_type=id_type
    ):
        cur.execute(statement)
    cur.execute(ddl.create_notification_index(schema, table, partitioned=layout > 0))
    sequence = _sequence_of(cur, schema, table)
    for statement in pg_sql.create_append_functions(
        schema=schema,
        table=table,
        function=ddl.append_function_name(table),
        id_type=id_type,
        sequence=sequence,
        lock_key=pg_sql.section_lock_key(schema, table),
        in_flight_space=pg_sql.in_flight_lock_space(schema, table),
    ):
        cur.execute(statement)


def event_log_partitions(cur: psycopg.Cursor[Any], schema: str, table: str) -> int | None:
    """The events table's layout: None (no table), 0 (unpartitioned) or its hash partitions."""
    qualified = SQL("{}.{}").format(Identifier(schema), Identifier(table)).as_string(cur)
    row = cur.execute(SQL("SELECT ") + ddl.event_log_layout(Literal(qualified))).fetchone()
    return None if row is None or row[0] is None else int(row[0])


_COLUMNS = (
    "originator_id, originator_version, topic, state, notification_id, transaction_id, event_hash, event_mac"
)


def change_event_log_layout(
    cur: psycopg.Cursor[Any], schema: str, table: str, id_type: str, partitions: int, settings: Settings
) -> int:
    """Rebuild the events table with ``partitions`` hash partitions (0: one table); the rows copied.

    In the migration's transaction: the table is locked (appends and reads wait, for at most
    a statement timeout to take the lock), renamed with its indexes and partitions, made
    again under its own name in the new layout drawing on the same notification sequence,
    filled with every row as it was (notification id, transaction id, hash and seal
    unchanged: followers' positions, the gap-safe horizon and the audit chain stay valid),
    given the old table's grants and triggers (retention's guard among them), and the old one
    dropped. Views on the events table stop
    it (they would have to be dropped with it): drop them first, make them again after.
    """
    cur = cur.connection.cursor(row_factory=tuple_row)
    s = Identifier(schema)
    target = SQL("{}.{}").format(s, Identifier(table))
    cur.execute(SQL("SET LOCAL lock_timeout = {}").format(int(settings.statement_timeout_s * 1000)))
    cur.execute(SQL("SET LOCAL statement_timeout = 0"))  # copying a long log may take a while
    cur.execute(SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(target))
    views = [str(r[0]) for r in cur.execute(_DEPENDENT_VIEWS, (target.as_string(cur),)).fetchall()]
    if views:
        raise ValidationError(
            "event_partitions",
            f"views depend on {schema}.{table} ({', '.join(views)}): drop them, migrate, make them again",
        )
    sequence = _sequence_of(cur, schema, table)
    old = f"{table[:40]}_relayout"
    triggers = [
        str(r[0])
        for r in cur.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass "
            "AND NOT tgisinternal ORDER BY tgname",
            (target.as_string(cur),),
        ).fetchall()
    ]
    _move_aside(cur, schema, table, old)
    old_target = SQL("{}.{}").format(s, Identifier(old))
    for statement in pg_sql.create_table(schema, table, id_type, partitions=partitions, sequence=sequence):
        cur.execute(statement)
    cur.execute(ddl.create_notification_index(schema, table, partitioned=partitions > 0))
    cur.execute(
        SQL("INSERT INTO {} ({c}) SELECT {c} FROM {} ORDER BY notification_id").format(
            target, old_target, c=SQL(_COLUMNS)
        )
    )
    moved = cur.rowcount
    cur.execute(SQL("ALTER SEQUENCE {} OWNED BY {}.notification_id").format(SQL(sequence), target))
    for grant in _grants_of(cur, old_target.as_string(cur), target):
        cur.execute(grant)
    for trigger in triggers:  # on the table's name (retention's guard): made again after the copy
        cur.execute(trigger)
    cur.execute(SQL("DROP TABLE {}").format(old_target))
    cur.execute(SQL("ANALYZE {}").format(target))
    create_event_log(cur, schema, table, id_type, partitions=partitions)
    _log.warning("%s.%s: %s rows moved to %s", schema, table, moved, _layout_words(partitions))
    return moved


_DEPENDENT_VIEWS = (
    "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d "
    "JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class "
    "WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = %s::regclass AND v.oid <> d.refobjid"
)


def _move_aside(cur: psycopg.Cursor[Any], schema: str, table: str, old: str) -> None:
    """Rename the table, its partitions and every index of them, freeing their names."""
    s = Identifier(schema)
    qualified = SQL("{}.{}").format(s, Identifier(table)).as_string(cur)
    relations = cur.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.oid = %s::regclass "
        "UNION ALL SELECT c.oid, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass",
        (qualified, qualified),
    ).fetchall()
    indexes = cur.execute(
        "SELECT x.relname FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
        "WHERE i.indrelid = ANY(%s::oid[]) ORDER BY x.relname",
        ([oid for oid, _ in relations],),
    ).fetchall()
    for number, (index,) in enumerate(indexes):
        cur.execute(
            SQL("ALTER INDEX {}.{} RENAME TO {}").format(s, Identifier(index), Identifier(f"{old}_i{number}"))
        )
    for number, (_, name) in enumerate(relations):
        renamed = old if name == table else f"{old}_p{number}"
        cur.execute(SQL("ALTER TABLE {}.{} RENAME TO {}").format(s, Identifier(name), Identifier(renamed)))


def _grants_of(cur: psycopg.Cursor[Any], old: str, target: Composed) -> list[Composed]:
    """GRANT statements giving ``target`` every privilege others hold on ``old``."""
    rows = cur.execute(
        "SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, "
        "a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a "
        "WHERE c.oid = %s::regclass AND a.grantee <> c.relowner",
        (old,),
    ).fetchall()
    grants = []
    for grantee, privilege, grantable in rows:
        if not str(privilege).replace(" ", "").isalpha():
            continue
        grants.append(
            SQL("GRANT {} ON {} TO {}{}").format(
                SQL(str(privilege)),
                target,
                SQL("PUBLIC") if grantee is None else Identifier(str(grantee)),
                SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )
    return grants


def _sequence_of(cur: psycopg.Cursor[Any], schema: str, table: str) -> str:
    qualified = SQL("{}.{}").format(Identifier(schema), Identifier(table)).as_string(cur)
    row = cur.execute("SELECT pg_get_serial_sequence(%s, 'notification_id')", (qualified,)).fetchone()
    if row is None or row[0] is None:
        msg = f"{schema}.{table}.notification_id has no sequence"
        raise psycopg.errors.ObjectNotInPrerequisiteState(msg)
    return str(row[0])


def force_sequence_cache_1(cur: psycopg.Cursor[Any], schema: str, table: str) -> bool:
    """A cached sequence hands each backend a block of ids: a later writer can commit a
    lower id after a reader passed it, which the horizon cannot see (it orders by
    transaction, and the lower id's transaction started later). Writers that already
    hold a cached block are refused by the append functions until they reconnect (the
    recorder closes a refused connection). True when it changed the cache."""
    sequence = _sequence_of(cur, schema, table)
    row = cur.execute(
        "SELECT seqcache FROM pg_sequence WHERE seqrelid = %s::regclass", (sequence,)
    ).fetchone()
    if row is None or row[0] == 1:
        return False
    try:
        cur.execute(SQL("ALTER SEQUENCE {} CACHE 1").format(SQL(sequence)))
    except psycopg.errors.InsufficientPrivilege:
        raise MigrationRefused(
            schema,
            f"sequence {sequence} has CACHE {row[0]} and needs CACHE 1 (with more, readers can skip"
            " ids); only its owner may change it: its owner should run `flowledger migrate`",
        ) from None
    _log.warning("sequence %s had CACHE %s; set to CACHE 1 (readers could skip ids)", sequence, row[0])
    return True


def remake_stale_functions(cur: psycopg.Cursor[Any], schema: str, table: str, id_type: str) -> bool:
    """Make the append functions (and retention's guard, where retention made one) again when
    they are missing or name another schema (``ddl.functions_stale``); whether it did.

    ``ALTER SCHEMA ... RENAME`` (or a dump restored under another name) keeps function bodies
    as they were: the appends went on naming the old schema's sequence and table ("schema ...
    does not exist" on every append, exit 70) and taking the old name's id-section lock, which
    readers of the new name do not look at."""
    stale = cur.execute(SQL("SELECT ") + ddl.functions_stale(schema, table)).fetchone()
    if not (stale and stale[0]):
        return False
    create_event_log(cur, schema, table, id_type, partitions=event_log_partitions(cur, schema, table) or 0)
    guard = cur.execute(
        "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = %s",
        (schema, retention.GUARD),
    ).fetchone()
    if guard is not None:
        cur.execute(retention.guard_ddl(schema, table))
    _log.warning("%s.%s: append functions named another schema (renamed?); made again", schema, table)
    return True


def restore_log_indexes(cur: psycopg.Cursor[Any], schema: str, table: str) -> tuple[str, ...]:
    """Make the events table's primary key and unique index on notification ids again where
    they are missing or invalid (dropped in the database); the names made.

    Without the key a save at a version already stored is not refused (two engines' saves of
    one stream would both be kept); without the index an id taken twice is not refused and
    every reader scans the table. Each is built under the migration's transaction (writes wait
    for it). Rows that break either (stored while it was missing) stop the migration: they
    must be looked at, not dropped (``LogDamaged``)."""
    cur = cur.connection.cursor(row_factory=tuple_row)
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    check = SQL("SELECT ") + ddl.log_indexes_missing(Literal(target.as_string(cur)))
    missing = cur.execute(check).fetchone()
    if not (missing and missing[0]):
        return ()
    made: list[str] = []
    qualified = target.as_string(cur)
    partitioned = bool(event_log_partitions(cur, schema, table))
    has_key = cur.execute(
        "SELECT 1 FROM pg_index WHERE indrelid = %s::regclass AND indisprimary AND indisvalid", (qualified,)
    ).fetchone()
    try:
        if has_key is None:
            key = ddl.primary_key_name(table)
            cur.execute(SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(target, Identifier(key)))
            cur.execute(
                SQL(
                    "ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (originator_id, originator_version)"
                ).format(target, Identifier(key))
            )
            made.append(key)
        still = cur.execute(check).fetchone()
        if still and still[0]:
            index = ddl.notification_index_name(table)
            cur.execute(SQL("DROP INDEX IF EXISTS {}.{}").format(Identifier(schema), Identifier(index)))
            cur.execute(ddl.create_notification_index(schema, table, partitioned=partitioned))
            made.append(index)
    except psycopg.errors.UniqueViolation as error:
        detail = (error.diag.message_detail or str(error)).strip()
        raise LogDamaged(
            "",
            0,
            f"{schema}.{table} lost a unique index and holds rows it would refuse ({detail}):"
            " two events at one stream version, or one notification id taken twice",
        ) from None
    _log.warning("%s.%s had lost unique indexes; made again: %s", schema, table, ", ".join(made))
    return tuple(made)


def repair_sequence_order(
    cur: psycopg.Cursor[Any], schema: str, table: str, *, taken: int | None = None
) -> tuple[str, ...]:
    """Make the notification sequence hand out only ids above every stored one; what it changed.

    An operator's ``ALTER SEQUENCE`` or ``setval`` can make it count down, cycle, stop at a
    maximum, or start again below stored ids. Readers never go back past an id they consumed,
    so an event stored below one is never delivered to them; where it hits a stored id, every
    append failed as a version clash until ``ConcurrentUpdate``. In the caller's transaction:
    the append's id section is held (``pg_advisory_xact_lock`` on its key) while the sequence
    is set past the highest stored id, so no append takes an id meanwhile. ``taken``: the id an
    append drew and found stored (the recorder's repair while engines run): its row is recorded
    too, as one past what the sequence had issued before (``sequence_repairs.py``)."""
    cur = cur.connection.cursor(row_factory=tuple_row)
    sequence = _sequence_of(cur, schema, table)
    row = cur.execute(
        "SELECT seqincrement, seqcycle, seqmax FROM pg_sequence WHERE seqrelid = %s::regclass", (sequence,)
    ).fetchone()
    if row is None:
        return ()
    increment, cycle, maximum = int(row[0]), bool(row[1]), int(row[2])
    options: list[str] = []
    repairs: list[str] = []
    if increment < 1:
        options.append("INCREMENT BY 1")
        repairs.append(f"increment {increment} set to 1")
    if cycle:
        options.append("NO CYCLE")
        repairs.append("cycle turned off")
    if maximum < _BIGINT_MAX:
        options.append("NO MAXVALUE")
        repairs.append(f"maximum {maximum} removed")
    try:
        if options:
            cur.execute(SQL("ALTER SEQUENCE {} {}").format(SQL(sequence), SQL(" ".join(options))))
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (pg_sql.section_lock_key(schema, table),))
        last, highest = cur.execute(
            SQL(
                "SELECT pg_sequence_last_value({}::regclass), "
                "(SELECT notification_id FROM {}.{} ORDER BY notification_id DESC LIMIT 1)"
            ).format(Literal(sequence), Identifier(schema), Identifier(table))
        ).fetchone() or (None, None)
        behind = highest is not None and (last is None or last < highest)
        if behind or taken is not None:
            # The rows past it are evidence (only an edit, or the sequence set back by hand, puts
            # them there): recorded first, for ``audit verify`` to name (``sequence_repairs.py``).
            recorded = sequence_repairs.record(cur, schema, table, int(last or 0), taken=taken)
            if recorded:
                repairs.append(
                    f"{recorded} row{'s' if recorded != 1 else ''} stored past it recorded"
                    " (`flowledger audit verify` names them)"
                )
        if behind:
            cur.execute("SELECT setval(%s::regclass, %s)", (sequence, highest))
            repairs.append(f"set forward from {last if last is not None else 'its start'} to {highest}")
    except psycopg.errors.InsufficientPrivilege:
        raise MigrationRefused(
            schema,
            f"sequence {sequence} may hand out ids at or below stored ones and needs"
            f" {', '.join(repairs) or 'setting past the highest stored id'}; only its owner may"
            " change it: its owner should run `flowledger migrate`",
        ) from None
    if repairs:
        _log.warning(
            "sequence %s could hand out ids at or below stored ones (readers skip them): %s",
            sequence,
            "; ".join(repairs),
        )
    return tuple(repairs)


_BIGINT_MAX = 9223372036854775807


def _repair_foreign_transaction_ids(cur: psycopg.Cursor[Any], schema: str, table: str) -> int:
    """Rewrite to 0 every ``transaction_id`` this cluster has not issued yet.

    Such rows came from another cluster (a dump and restore, a logical copy): a live
    cluster never stores an id at or above its snapshot's xmax, the next id to assign.
    They are all committed (a dump holds committed rows only) and all older than any
    transaction of this cluster, so 0, below every horizon, is their true place; left
    alone they stay "in the future" and every reader stops before them until the
    counter catches up. The test uses the statement's own snapshot, so rows appended
    concurrently (ids below that xmax) are never touched.
    """
    cur.execute(ddl.repair_foreign_transaction_ids(schema, table))
    repaired = cur.rowcount
    if repaired:
        _log.warning(
            "%s.%s: %s rows carried transaction ids from another cluster; rewritten to 0",
            schema,
            table,
            repaired,
        )
    return repaired
