"""Retention's tables: the policies per workflow, and the bases archived streams keep (docs/retention.md).

A *base* stands in for the events of a stream that were moved to a bundle and deleted: the
head they ended at (version and chained hash, as the checkpoints signed it), the log
positions they held, the session's totals, its state snapshot as stored, the bundle's path
and digest, and the rows each projection held for it (so a rebuild from the log gives the
same tables). Its ``seal`` is an HMAC under the chain key over the fields that prove
something: someone with only database access can delete rows, but cannot write a base
that ``audit verify`` accepts for them.

The tables are made by the first retention command on a schema (``ensure_tables``), not by
``migrate``; readers elsewhere (the chain, ``audit verify``, projection builds) look them up
with ``to_regclass`` and treat a schema without them as one with no archived streams.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL, Composed, Identifier

from flowledger.domain.errors import ValidationError
from flowledger.domain.session import session_uuid

POLICIES = "flowledger_retention_policies"
BASES = "flowledger_retention_bases"
_SEAL_TAG = b"flowledger.retention-base.v2\x00"
_SEAL_TAG_V1 = b"flowledger.retention-base.v1\x00"
"""Bases archived before the seal covered their projection rows (still accepted, rows unproven)."""
ROWS_DIGEST = "encode(sha256(convert_to({}::text, 'UTF8')), 'hex')"
"""The projection rows' digest, taken by PostgreSQL on its own canonical text of the jsonb
(keys ordered, numbers normalised), so sealing and checking agree whatever Python read back."""

_DDL = """
CREATE TABLE IF NOT EXISTS {s}.{policies} (
    tenant text NOT NULL,
    workflow text NOT NULL,
    days integer NOT NULL CHECK (days > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, workflow)
);
CREATE TABLE IF NOT EXISTS {s}.{bases} (
    stream_id uuid PRIMARY KEY,
    tenant text NOT NULL,
    workflow text NOT NULL,
    session_id text NOT NULL,
    status text NOT NULL,
    through_version bigint NOT NULL,
    head_hash bytea NOT NULL,
    positions bigint[] NOT NULL,
    last_event_at timestamptz NOT NULL,
    totals jsonb NOT NULL,
    snapshot_topic text NOT NULL,
    snapshot_state bytea NOT NULL,
    projection_rows jsonb NOT NULL,
    bundle text NOT NULL,
    bundle_sha256 text NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    seal bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS {bases_by_workflow} ON {s}.{bases} (tenant, workflow);
"""
_GUARD_DDL = """
CREATE OR REPLACE FUNCTION {s}.{guard}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.{bases} WHERE stream_id = NEW.originator_id
               AND through_version >= NEW.originator_version) THEN
        RAISE EXCEPTION 'version % of stream % is archived (a retention base holds it)',
            NEW.originator_version, NEW.originator_id USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER {guard} BEFORE INSERT ON {s}.{events}
    FOR EACH ROW EXECUTE FUNCTION {s}.{guard}();
"""
GUARD = "flowledger_archived_versions"
"""The trigger (and its function) that refuses an append at a version a base stands for."""


def guard_ddl(schema: str, events: str) -> Composed:
    """The guard's function and trigger on ``schema.events`` (made again by ``migrate`` when the
    schema was renamed: the function names the schema in its body)."""
    return SQL(_GUARD_DDL).format(
        s=Identifier(schema), bases=Identifier(BASES), guard=Identifier(GUARD), events=Identifier(events)
    )


@dataclass(frozen=True, kw_only=True)
class Base:
    """What an archived stream keeps in the database in place of its events."""

    stream_id: UUID
    tenant: str
    workflow: str
    session_id: str
    status: str
    through_version: int
    """The version of the last archived event (the head the checkpoints signed)."""
    head_hash: bytes
    positions: tuple[int, ...]
    """The log positions (notification ids) the archived events held, in version order."""
    last_event_at: str
    """ISO time of the last archived event."""
    totals: dict[str, Any]
    snapshot_topic: str
    snapshot_state: bytes
    projection_rows: dict[str, Any]
    bundle: str
    bundle_sha256: str
    projection_rows_sha256: str | None = None
    """SHA-256 of the projection rows as PostgreSQL prints them (``ROWS_DIGEST``); None for a
    base sealed before the seal covered them (``_SEAL_TAG_V1``)."""

    def sealed_fields(self) -> bytes:
        """The canonical bytes the seal covers: the projection rows' digest too, when known."""
        fields: dict[str, Any] = {
            "stream": str(self.stream_id),
            "through_version": self.through_version,
            "head_hash": self.head_hash.hex(),
            "positions": list(self.positions),
            "totals": self.totals,
            "bundle_sha256": self.bundle_sha256,
            "snapshot_sha256": hashlib.sha256(self.snapshot_state).hexdigest(),
        }
        tag = _SEAL_TAG_V1
        if self.projection_rows_sha256 is not None:
            fields["projection_rows_sha256"] = self.projection_rows_sha256
            tag = _SEAL_TAG
        return tag + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def seal(self, key: bytes) -> bytes:
        """The base's HMAC under the chain key."""
        return hmac.new(key, self.sealed_fields(), hashlib.sha256).digest()


@dataclass(frozen=True)
class StoredBase:
    """A base as read back, with whether its seal checks."""

    base: Base
    sealed: bool
    archived_at: str


class RetentionTables:
    """SQL over the retention tables of one schema."""

    def __init__(
        self, schema: str, events: str = "flowledger_events", snapshots: str = "flowledger_snapshots"
    ) -> None:
        self.schema = schema
        self.events = events
        self.snapshots = snapshots

    def _t(self, name: str) -> Composed:
        return SQL("{}.{}").format(Identifier(self.schema), Identifier(name))

    def ensure(self, conn: psycopg.Connection[Any]) -> None:
        """Create the tables if they are missing, and the events table's guard: an insert at a
        version an archived stream's base stands for fails as a version clash does (the rows
        are gone, so the primary key no longer refuses it: a start of the same session id,
        or a writer whose cached copy is older than the archived head)."""
        if self.exists(conn):
            return
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"flowledger-retention:{self.schema}"])
        conn.execute(
            SQL(_DDL).format(
                s=Identifier(self.schema),
                policies=Identifier(POLICIES),
                bases=Identifier(BASES),
                bases_by_workflow=Identifier(f"{BASES}_by_workflow"),
            )
        )
        conn.execute(guard_ddl(self.schema, self.events))

    def exists(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the bases table exists (a schema no retention command touched has none)."""
        row = conn.execute("SELECT to_regclass(%s)", [self._t(BASES).as_string(conn)]).fetchone()
        return row is not None and row[0] is not None

    # -- policies -------------------------------------------------------------------------

    def set_policy(self, conn: psycopg.Connection[Any], tenant: str, workflow: str, days: int) -> None:
        """Keep ``workflow``'s closed sessions ``days`` days after their last event."""
        conn.execute(
            SQL(
                "INSERT INTO {} (tenant, workflow, days) VALUES (%s, %s, %s) ON CONFLICT (tenant, workflow)"
                " DO UPDATE SET days = EXCLUDED.days, updated_at = now()"
            ).format(self._t(POLICIES)),
            (tenant, workflow, days),
        )

    def delete_policy(self, conn: psycopg.Connection[Any], tenant: str, workflow: str) -> bool:
        """Drop ``workflow``'s policy; whether there was one."""
        cur = conn.execute(
            SQL("DELETE FROM {} WHERE tenant = %s AND workflow = %s").format(self._t(POLICIES)),
            (tenant, workflow),
        )
        return cur.rowcount > 0

    def policies(self, conn: psycopg.Connection[Any], tenant: str) -> dict[str, int]:
        """The tenant's policies: workflow -> days."""
        rows = conn.execute(
            SQL("SELECT workflow, days FROM {} WHERE tenant = %s ORDER BY workflow").format(
                self._t(POLICIES)
            ),
            (tenant,),
        ).fetchall()
        return {str(w): int(d) for w, d in rows}

    # -- bases ----------------------------------------------------------------------------

    def insert_bases(self, conn: psycopg.Connection[Any], bases: Sequence[Base], key: bytes) -> None:
        """Store the bases (sealed with ``key``, their projection rows included); an existing
        base of a stream is replaced."""
        digests = conn.execute(
            SQL("SELECT {} FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t(r, n) ORDER BY n").format(
                SQL(ROWS_DIGEST.format("r"))
            ),
            [[json.dumps(b.projection_rows) for b in bases]],
        ).fetchall()
        bases = [replace(b, projection_rows_sha256=d[0]) for b, d in zip(bases, digests, strict=True)]
        with conn.cursor() as cur:
            cur.executemany(
                SQL(
                    "INSERT INTO {} (stream_id, tenant, workflow, session_id, status, through_version,"
                    " head_hash, positions, last_event_at, totals, snapshot_topic, snapshot_state,"
                    " projection_rows, bundle, bundle_sha256, seal)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (stream_id) DO UPDATE SET through_version = EXCLUDED.through_version,"
                    " head_hash = EXCLUDED.head_hash, positions = EXCLUDED.positions,"
                    " last_event_at = EXCLUDED.last_event_at, totals = EXCLUDED.totals,"
                    " snapshot_topic = EXCLUDED.snapshot_topic, snapshot_state = EXCLUDED.snapshot_state,"
                    " projection_rows = EXCLUDED.projection_rows, bundle = EXCLUDED.bundle,"
                    " bundle_sha256 = EXCLUDED.bundle_sha256, status = EXCLUDED.status,"
                    " archived_at = now(), seal = EXCLUDED.seal"
                ).format(self._t(BASES)),
                [
                    (
                        b.stream_id,
                        b.tenant,
                        b.workflow,
                        b.session_id,
                        b.status,
                        b.through_version,
                        b.head_hash,
                        list(b.positions),
                        b.last_event_at,
                        json.dumps(b.totals),
                        b.snapshot_topic,
                        b.snapshot_state,
                        json.dumps(b.projection_rows),
                        b.bundle,
                        b.bundle_sha256,
                        b.seal(key),
                    )
                    for b in bases
                ],
            )

    def bases(
        self,
        conn: psycopg.Connection[Any],
        key: bytes,
        streams: Iterable[UUID] | None = None,
        *,
        with_rows: bool = False,
        lock: bool = False,
        for_update: bool = False,
    ) -> dict[UUID, StoredBase]:
        """The stored bases (of ``streams``, or all), each with whether its seal checks; their
        projection rows only ``with_rows`` (else empty; their digest is checked either way).
        With ``lock``, the rows are held (FOR SHARE) until the transaction ends, so what was
        checked is what a later statement of it reads; ``for_update`` holds them for a change
        (a restore: a second one waits, then finds them gone)."""
        where: SQL | Composed = SQL(" WHERE stream_id = ANY(%s)") if streams is not None else SQL("")
        if lock or for_update:
            where = SQL("{} FOR UPDATE" if for_update else "{} FOR SHARE").format(where)
        params: list[Any] = [list(streams)] if streams is not None else []
        rows_column = SQL("projection_rows") if with_rows else SQL("'{}'::jsonb")
        rows = conn.execute(
            SQL(
                "SELECT stream_id, tenant, workflow, session_id, status, through_version, head_hash,"
                " positions, last_event_at, totals, snapshot_topic, snapshot_state, {},"
                " bundle, bundle_sha256, seal, archived_at, {} FROM {}{}"
            ).format(rows_column, SQL(ROWS_DIGEST.format("projection_rows")), self._t(BASES), where),
            params,
        ).fetchall()
        found: dict[UUID, StoredBase] = {}
        for row in rows:
            base = Base(
                stream_id=row[0],
                tenant=row[1],
                workflow=row[2],
                session_id=row[3],
                status=row[4],
                through_version=int(row[5]),
                head_hash=bytes(row[6]),
                positions=tuple(int(p) for p in row[7]),
                last_event_at=row[8].isoformat(),
                totals=row[9],
                snapshot_topic=row[10],
                snapshot_state=bytes(row[11]),
                projection_rows=row[12],
                bundle=row[13],
                bundle_sha256=row[14],
                projection_rows_sha256=row[17],
            )
            seal = bytes(row[15])
            sealed = _names_its_stream(base) and (
                hmac.compare_digest(base.seal(key), seal)
                or hmac.compare_digest(replace(base, projection_rows_sha256=None).seal(key), seal)
            )
            found[base.stream_id] = StoredBase(base, sealed, row[16].isoformat())
        return found

    def put_snapshots(self, conn: psycopg.Connection[Any], bases: Sequence[Base]) -> None:
        """Store each base's snapshot, byte for byte as its seal covers it, at its head version
        (replacing one there: an engine's own, or one edited meanwhile). An archived session is
        read from this row, so ``audit verify`` can then compare the two bytewise."""
        streams = [b.stream_id for b in bases]
        versions = [b.through_version for b in bases]
        conn.execute(
            SQL(
                "DELETE FROM {} s USING unnest(%s::uuid[], %s::bigint[]) AS a(id, v)"
                " WHERE s.originator_id = a.id AND s.originator_version = a.v"
            ).format(self._t(self.snapshots)),
            [streams, versions],
        )
        conn.execute(
            SQL(
                "INSERT INTO {} (originator_id, originator_version, topic, state)"
                " SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[])"
            ).format(self._t(self.snapshots)),
            [streams, versions, [b.snapshot_topic for b in bases], [b.snapshot_state for b in bases]],
        )

    def latest_snapshots(
        self, conn: psycopg.Connection[Any], streams: Sequence[UUID]
    ) -> dict[UUID, tuple[int, str, bytes, bool]]:
        """Per stream, the snapshot a load starts from (its highest version): version, topic,
        state, and whether an event row is stored at that version."""
        rows = conn.execute(
            SQL(
                "SELECT DISTINCT ON (s.originator_id) s.originator_id, s.originator_version, s.topic,"
                " s.state, EXISTS (SELECT 1 FROM {events} e WHERE e.originator_id = s.originator_id"
                " AND e.originator_version = s.originator_version)"
                " FROM {snapshots} s WHERE s.originator_id = ANY(%s)"
                " ORDER BY s.originator_id, s.originator_version DESC"
            ).format(events=self._t(self.events), snapshots=self._t(self.snapshots)),
            [list(streams)],
        ).fetchall()
        return {r[0]: (int(r[1]), str(r[2]), bytes(r[3]), bool(r[4])) for r in rows}

    def snapshots_holding(
        self, conn: psycopg.Connection[Any], tenant: str, needles: Sequence[bytes]
    ) -> list[UUID]:
        """The ``tenant``'s archived streams whose base's snapshot holds one of ``needles``."""
        rows = conn.execute(
            SQL(
                "SELECT stream_id FROM {} WHERE tenant = %s AND EXISTS"
                " (SELECT 1 FROM unnest(%s::bytea[]) AS n(b) WHERE position(n.b IN snapshot_state) > 0)"
            ).format(self._t(BASES)),
            [tenant, list(needles)],
        ).fetchall()
        return [row[0] for row in rows]

    def delete_bases(self, conn: psycopg.Connection[Any], streams: Sequence[UUID]) -> int:
        """Drop the bases of ``streams`` (restored); how many there were."""
        cur = conn.execute(
            SQL("DELETE FROM {} WHERE stream_id = ANY(%s)").format(self._t(BASES)), [list(streams)]
        )
        return cur.rowcount

    def stored_heads(self, conn: psycopg.Connection[Any], heads: dict[UUID, tuple[int, bytes]]) -> set[UUID]:
        """Which of the streams have their event at ``heads``' version stored, with that hash."""
        if not heads:
            return set()
        rows = conn.execute(
            SQL(
                "SELECT e.originator_id FROM {} e JOIN unnest(%s::uuid[], %s::bigint[], %s::bytea[])"
                " AS h(id, v, hash) ON e.originator_id = h.id AND e.originator_version = h.v"
                " AND e.event_hash = h.hash"
            ).format(self._t(self.events)),
            [list(heads), [v for v, _ in heads.values()], [h for _, h in heads.values()]],
        ).fetchall()
        return {row[0] for row in rows}


def _names_its_stream(base: Base) -> bool:
    """Whether the base's tenant and session id are the ones its (sealed) stream id was made
    from: the seal does not cover them itself, and a restore trusts the tenant."""
    try:
        return session_uuid(base.tenant, base.session_id) == base.stream_id
    except ValidationError:  # edited into something that is no name
        return False


def head_of_base_sql(schema: str) -> str:
    """The head hash a base keeps for (stream, version): the predecessor of a stream's first
    event after archiving (``chain.py``)."""
    return (
        SQL("SELECT head_hash FROM {}.{} WHERE stream_id = %s AND through_version = %s")
        .format(Identifier(schema), Identifier(BASES))
        .as_string(None)
    )


def bases_table_name(schema: str) -> str:
    """``schema.bases`` quoted, for ``to_regclass``."""
    return SQL("{}.{}").format(Identifier(schema), Identifier(BASES)).as_string(None)
