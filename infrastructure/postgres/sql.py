"""SQL for flowledger's PostgreSQL event log: the table, the append function, the reads.

Kept apart from the recorder so that the statements (and the reasoning in their
comments) can be read in one place. See ``flowledger.infrastructure.postgres.recorder`` for
why the append takes ids inside a short section and why readers stop at a horizon.
"""

from __future__ import annotations

import hashlib

from psycopg.sql import SQL, Composed, Identifier, Literal

# Raised (as SQLSTATE 55000, object_not_in_prerequisite_state) when the append function
# runs in a transaction that already has an id: its rows could then sort before rows
# of transactions that took ids earlier, and readers could skip them.
XID_ALREADY_ASSIGNED = "the event log append must be the first write of its transaction"
ID_FROM_SEQUENCE_CACHE = "the event log's id sequence handed out a cached id (it needs CACHE 1)"
"""The append functions' refusal of an id that is not the sequence's last value."""


def advisory_key(text: str) -> int:
    """A stable advisory-lock key (signed 64-bit) for ``text``: every engine of every version
    computes the same one, so a key's text must never change."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


def section_lock_key(schema: str, table: str) -> int:
    """A stable advisory-lock key (signed 64-bit) for one events table."""
    return advisory_key(f"flowledger:{schema}.{table}")


def in_flight_lock_space(schema: str, table: str) -> int:
    """The lock space (``pg_locks.classid``, 1..2**31-1) of one events table's in-flight markers.

    Each append holds ``pg_advisory_xact_lock_shared(space << 32 | low 32 bits of its
    transaction id)`` from inside its id section until it commits or rolls back; readers
    find the appends still in flight as the advisory locks with this ``classid``.
    """
    digest = hashlib.blake2b(f"flowledger-in-flight:{schema}.{table}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % 0x7FFFFFFF + 1


def create_table(
    schema: str, table: str, originator_id_type: str, *, partitions: int = 0, sequence: str | None = None
) -> list[Composed]:
    """The events table: the library's columns, the appending transaction's id, and the
    event's chained hash and keyed seal (``flowledger.verify``; NULL: written unchained).

    ``partitions`` > 0: hash-partitioned by stream (``originator_id``) into that many
    partitions ``<table>_p<i>``; the primary key (originator_id, originator_version)
    includes the partition key, so PostgreSQL enforces it as it does unpartitioned.
    ``sequence``: draw notification ids from that existing sequence instead of a new one
    (a layout change keeps the log's sequence, ``migrations.change_layout``).
    """
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    notification_id = (
        SQL("bigserial")
        if sequence is None
        else SQL("bigint NOT NULL DEFAULT nextval({}::regclass)").format(Literal(sequence))
    )
    columns = SQL(
        "CREATE TABLE IF NOT EXISTS {target} ("
        "originator_id {id_type} NOT NULL, "
        "originator_version bigint NOT NULL, "
        "topic text, "
        "state bytea, "
        "notification_id {notification_id}, "
        "transaction_id xid8 NOT NULL, "
        "event_hash bytea, "
        "event_mac bytea, "
        "PRIMARY KEY (originator_id, originator_version))"
    ).format(target=target, id_type=Identifier(originator_id_type), notification_id=notification_id)
    if partitions <= 0:
        return [columns]
    statements = [columns + SQL(" PARTITION BY HASH (originator_id)")]
    for remainder in range(partitions):
        statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{partition} PARTITION OF {target} "
                "FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})"
            ).format(
                schema=Identifier(schema),
                partition=Identifier(partition_name(table, remainder)),
                target=target,
                modulus=Literal(partitions),
                remainder=Literal(remainder),
            )
        )
    return statements


def partition_name(table: str, remainder: int) -> str:
    """The name of one hash partition of ``table`` (``<table>_p<remainder>``, at most 63 bytes)."""
    suffix = f"_p{remainder}"
    return table[: 63 - len(suffix)] + suffix


def add_transaction_id(schema: str, table: str) -> list[Composed]:
    """Upgrade a table the library's stock recorder created.

    Existing rows all committed long ago, so 0 (below every horizon) is true for them.
    The default is dropped again so that a stock writer still running against the
    table fails loudly instead of writing rows that readers would order wrongly.
    """
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    return [
        SQL("ALTER TABLE {} ADD COLUMN transaction_id xid8 NOT NULL DEFAULT '0'").format(target),
        SQL("ALTER TABLE {} ALTER COLUMN transaction_id DROP DEFAULT").format(target),
    ]


def add_chain_columns(schema: str, table: str) -> list[Composed]:
    """Upgrade a table from before the chain: rows already there stay NULL (unchained) until
    ``flowledger audit chain`` chains them."""
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    return [
        SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS event_hash bytea").format(target),
        SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS event_mac bytea").format(target),
    ]


def drop_unchained_append_functions(*, schema: str, function: str, id_type: str) -> list[Composed]:
    """The append functions of schema version 2 (no hash arguments): an engine still calling
    them fails loudly instead of writing rows that break the chain."""
    names = {"schema": Identifier(schema), "id_type": Identifier(id_type)}
    return [
        SQL("DROP FUNCTION IF EXISTS {schema}.{one}({id_type}, bigint, text, bytea)").format(
            one=Identifier(f"{function}_one"[:63]), **names
        ),
        SQL("DROP FUNCTION IF EXISTS {schema}.{many}({id_type}[], bigint[], text[], bytea[])").format(
            many=Identifier(function), **names
        ),
    ]


def create_append_functions(
    *,
    schema: str,
    table: str,
    function: str,
    id_type: str,
    sequence: str,
    lock_key: int,
    in_flight_space: int,
) -> list[Composed]:
    """The append: one call, one round trip, one commit (the caller's autocommit).

    Only taking the transaction id and the notification ids is serialised (a session
    advisory lock held for microseconds); the insert, index updates and commit run
    concurrently, so commits from many writers share WAL flushes. ``<function>_one``
    appends a single event (the common save) with scalar arguments, ``<function>``
    many, as parallel arrays: both avoid composite-type arrays, which cost more to send
    than the insert itself.

    Inside the section, right after taking its transaction id and before its
    notification ids, the append takes a transaction-scoped marker lock (see
    ``in_flight_lock_space``), which PostgreSQL releases only after the commit (or
    rollback) is visible to new snapshots: readers take their horizon from these markers
    (``horizon``), so only appends to this log hold them back.

    The section is an inner block with an exception handler, so that anything failing
    in it (a cancel, a statement timeout, an exhausted sequence) releases the lock in
    the same statement: a session lock survives rollback, and an unlock sent later as a
    separate statement could reach another backend behind a transaction-pooling
    PgBouncer. The section also refuses an id that is not the sequence's last value: with a
    cache (``ALTER SEQUENCE ... CACHE 10``, even while engines run) a backend hands out ids
    from a block it took earlier, below ids other writers already committed, and a follower
    that passed them never reads them (measured: 1,743 of 4,310 events never delivered). Only
    these functions take ids, under this lock, so with ``CACHE 1`` the id just taken is
    always the last value. The unlock is the section's last statement, inside the block: after
    the block it was past the handler, and a statement timeout or cancel taken at the start of
    that unlock left the lock held by a pooled connection (schema version 7). The handler
    unlocks only if the lock is still held (a cancel may arrive while waiting for it, or after
    the unlock). The block costs a subtransaction per append, which gets no
    id of its own (the transaction id is the top-level one), measured in docs/recorder.md.
    """
    guard = SQL(
        "  IF pg_current_xact_id_if_assigned() IS NOT NULL THEN\n"
        "    RAISE EXCEPTION {message} USING ERRCODE = 'object_not_in_prerequisite_state';\n"
        "  END IF;\n"
    ).format(message=Literal(XID_ALREADY_ASSIGNED))
    cached = SQL(
        "    IF pg_sequence_last_value({sequence}) IS DISTINCT FROM {last} THEN\n"
        "      RAISE EXCEPTION {message} USING ERRCODE = 'object_not_in_prerequisite_state';\n"
        "    END IF;\n"
    )
    message = Literal(ID_FROM_SEQUENCE_CACHE)
    names = {
        "schema": Identifier(schema),
        "one": Identifier(f"{function}_one"[:63]),
        "many": Identifier(function),
        "table": Identifier(table),
        "id_type": Identifier(id_type),
        "sequence": Literal(sequence),
        "key": Literal(lock_key),
        "marker": Literal(in_flight_space << 32),
        "guard": guard,
        "release": _release_if_held(lock_key),
        "one_cached": cached.format(sequence=Literal(sequence), last=SQL("id"), message=message),
        "many_cached": cached.format(
            sequence=Literal(sequence), last=SQL("ids[cardinality(ids)]"), message=message
        ),
    }
    one = SQL(
        "CREATE OR REPLACE FUNCTION {schema}.{one}"
        "(p_id {id_type}, p_version bigint, p_topic text, p_state bytea, p_hash bytea, p_mac bytea) "
        "RETURNS bigint LANGUAGE plpgsql AS $body$\n"
        "DECLARE tx xid8; id bigint;\n"
        "BEGIN\n{guard}"
        "  BEGIN\n"
        "    PERFORM pg_advisory_lock({key});\n"
        "    tx := pg_current_xact_id();\n"
        "    PERFORM pg_advisory_xact_lock_shared({marker} | (tx::text::bigint & 4294967295));\n"
        "    id := nextval({sequence});\n{one_cached}"
        "    PERFORM pg_advisory_unlock({key});\n"
        "  EXCEPTION WHEN OTHERS OR query_canceled THEN\n{release}"
        "  END;\n"
        "  INSERT INTO {schema}.{table} "
        "(originator_id, originator_version, topic, state, notification_id, transaction_id, "
        "event_hash, event_mac) "
        "VALUES (p_id, p_version, p_topic, p_state, id, tx, p_hash, p_mac);\n"
        "  RETURN id;\n"
        "END;\n$body$"
    ).format(**names)
    many = SQL(
        "CREATE OR REPLACE FUNCTION {schema}.{many}"
        "(p_ids {id_type}[], p_versions bigint[], p_topics text[], p_states bytea[], "
        "p_hashes bytea[], p_macs bytea[]) "
        "RETURNS SETOF bigint LANGUAGE plpgsql AS $body$\n"
        "DECLARE tx xid8; ids bigint[];\n"
        "BEGIN\n{guard}"
        "  BEGIN\n"
        "    PERFORM pg_advisory_lock({key});\n"
        "    tx := pg_current_xact_id();\n"
        "    PERFORM pg_advisory_xact_lock_shared({marker} | (tx::text::bigint & 4294967295));\n"
        "    ids := ARRAY(SELECT nextval({sequence}) FROM generate_series(1, cardinality(p_ids)));\n"
        "{many_cached}"
        "    PERFORM pg_advisory_unlock({key});\n"
        "  EXCEPTION WHEN OTHERS OR query_canceled THEN\n{release}"
        "  END;\n"
        "  INSERT INTO {schema}.{table} "
        "(originator_id, originator_version, topic, state, notification_id, transaction_id, "
        "event_hash, event_mac)\n"
        "  SELECT u.i, u.v, u.t, u.s, u.n, tx, u.h, u.m "
        "FROM unnest(p_ids, p_versions, p_topics, p_states, ids, p_hashes, p_macs) "
        "AS u(i, v, t, s, n, h, m);\n"
        "  RETURN QUERY SELECT unnest(ids);\n"
        "END;\n$body$"
    ).format(**names)
    return [one, many]


def _release_if_held(lock_key: int) -> Composed:
    """The id section's exception handler: unlock if this session holds the lock, re-raise."""
    return SQL(
        "    PERFORM pg_advisory_unlock({key}) FROM pg_locks "
        "WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1 "
        "AND ((classid::bigint << 32) | objid::bigint) = {key};\n"
        "    RAISE;\n"
    ).format(key=Literal(lock_key))


_IN_FLIGHT = (
    # On a hot standby the primary's markers are not in ``pg_locks`` (advisory locks are not
    # WAL-logged), so there the horizon is the snapshot's xmin: the standby learns every
    # transaction id below the newest it replays as running until its commit or abort
    # replays, so ids below xmin have all finished (measured: an append left open on the
    # primary while a later one committed gave xmin = its id and xmax past the later one,
    # whose row xmax alone would have let readers take, skipping the open one's id).
    # ``waits``: a standby held back by some transaction (of any database of the cluster).
    "WITH r AS (SELECT (CASE WHEN pg_is_in_recovery() THEN pg_snapshot_xmin(s) "
    "ELSE pg_snapshot_xmax(s) END)::text::bigint AS x, "
    "pg_is_in_recovery() AND pg_snapshot_xmin(s) <> pg_snapshot_xmax(s) AS waits "
    "FROM pg_current_snapshot() AS s), "
    # Each marker's key holds the low 32 bits of its transaction id; every transaction
    # still running is within 2**31 of any current snapshot's xmax, so the nearest
    # full id with those low bits is the one.
    "f AS (SELECT r.x + (((l.objid::bigint - (r.x & 4294967295)) + 2147483648) & 4294967295) "
    "- 2147483648 AS xid, l.pid FROM r, pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.classid = {space}::oid "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) "
)


def horizon(space: int) -> Composed:
    """The first statement of every gap-safe read: the horizon, as a decimal transaction id.

    Rows whose ``transaction_id`` is below it may be read. It is the lowest transaction id
    of the appends to this log still in flight (their markers, ``in_flight_lock_space``),
    or, with none, this statement's snapshot xmax (no transaction that starts later can
    take a lower id). Transactions that never append to this log play no part. On a hot
    standby it is the snapshot's xmin: there every transaction of the primary's cluster
    still running holds readers back (docs/projections.md, Replicas).

    It must run as a statement of its own, before the statement that reads the rows:
    ``pg_locks`` is read while the statement runs, after its snapshot was taken, and an
    append that committed in between would be in neither (docs/recorder.md).
    """
    return SQL(_IN_FLIGHT + "SELECT LEAST(r.x, (SELECT min(xid) FROM f))::text AS horizon FROM r").format(
        space=Literal(space)
    )


def horizon_and_oldest(space: int) -> Composed:
    """``horizon``, whether an append is in flight (on a standby: any transaction), and how
    long (seconds) the lowest one has been open (NULL when none is, when its start is hidden
    from this role, or on a standby)."""
    return SQL(
        _IN_FLIGHT + "SELECT LEAST(r.x, o.xid)::text AS horizon, o.xid IS NOT NULL OR r.waits AS in_flight, "
        "(SELECT extract(epoch FROM clock_timestamp() - a.xact_start)::float8 FROM pg_stat_activity a "
        "WHERE a.pid = o.pid) AS oldest_s "
        "FROM r LEFT JOIN (SELECT xid, pid FROM f ORDER BY xid LIMIT 1) AS o ON true"
    ).format(space=Literal(space))


def select_notifications(
    schema: str,
    table: str,
    *,
    inclusive: bool,
    has_start: bool,
    has_stop: bool,
    has_topics: bool,
    has_unknown: bool = False,
) -> Composed:
    """Rows after ``start`` in id order, each flagged safe or not against a horizon (the first
    parameter, from ``horizon``); with ``has_unknown``, the rows of the topics asked for and
    of every topic not in a second list (the topics known, see ``select_notifications``).

    Unsafe rows are returned too, so the caller can cut the page there and knows which
    transaction ids to wait for.
    """
    conditions: list[SQL] = []
    if has_start:
        conditions.append(SQL("notification_id >= %s") if inclusive else SQL("notification_id > %s"))
    if has_stop:
        conditions.append(SQL("notification_id <= %s"))
    if has_topics:
        either = "(topic = ANY(%s) OR topic IS NULL OR topic <> ALL(%s))"
        conditions.append(SQL(either if has_unknown else "topic = ANY(%s)"))
    where = SQL(" WHERE ") + SQL(" AND ").join(conditions) if conditions else SQL("")
    return SQL(
        "SELECT notification_id, originator_id, originator_version, topic, state, "
        "transaction_id < %s::xid8 AS safe, transaction_id::text AS tx "
        "FROM {schema}.{table}{where} ORDER BY notification_id LIMIT %s"
    ).format(schema=Identifier(schema), table=Identifier(table), where=where)


def max_notification_id(schema: str, table: str) -> Composed:
    """The highest safe id, and the last visible row's transaction id and safety (the horizon
    twice as parameters)."""
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    return SQL(
        "SELECT (SELECT max(notification_id) FROM {t} WHERE transaction_id < %s::xid8) AS safe_max, "
        "l.transaction_id::text AS last_tx, l.transaction_id < %s::xid8 AS last_safe "
        "FROM (SELECT 1) AS one "
        "LEFT JOIN LATERAL (SELECT transaction_id FROM {t} ORDER BY notification_id DESC LIMIT 1) AS l "
        "ON true"
    ).format(t=target)


def committed_max_notification_id(schema: str, table: str) -> Composed:
    """The highest id of any committed row, horizon or not."""
    return SQL("SELECT max(notification_id) AS m FROM {}.{}").format(Identifier(schema), Identifier(table))


def horizon_lag(schema: str, table: str) -> Composed:
    """The readable head (below the horizon, the parameter), the committed head, and how many
    committed rows lie between them."""
    target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
    return SQL(
        "WITH r AS (SELECT coalesce(max(notification_id), 0) AS readable FROM {t} "
        "WHERE transaction_id < %s::xid8) "
        "SELECT r.readable, coalesce((SELECT max(notification_id) FROM {t}), 0) AS committed, "
        "(SELECT count(*) FROM {t} WHERE notification_id > r.readable) AS held_back FROM r"
    ).format(t=target)


def select_events_containing(schema: str, table: str) -> Composed:
    """One stream's rows of one topic whose state holds a byte string (``position`` on bytea),
    with their hash and seal and their predecessor's hash (``previous_hash``), to be checked."""
    return SQL(
        "SELECT e.originator_id, e.originator_version, e.topic, e.state, e.event_hash, e.event_mac,"
        " p.event_hash AS previous_hash FROM {schema}.{table} e LEFT JOIN {schema}.{table} p"
        " ON p.originator_id = e.originator_id AND p.originator_version = e.originator_version - 1"
        " WHERE e.originator_id = %s AND e.topic = %s AND position(%s::bytea IN e.state) > 0"
        " ORDER BY e.originator_version"
    ).format(schema=Identifier(schema), table=Identifier(table))
