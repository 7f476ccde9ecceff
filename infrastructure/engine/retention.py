"""Retention that keeps proof: closed sessions' events move to verified bundles (docs/retention.md).

``archive`` finds, per workflow with a policy, the closed sessions (completed, expired,
abandoned) whose last event is older than the policy's days, and for each batch of them:

1. exports their events as an audit bundle (``audit export``: events as stored, the heads'
   Merkle proofs, a signed checkpoint) under a temporary name, checks it with
   ``flowledger.verify`` against this engine's public key, and links it into place;
2. in one transaction, writes each session's *base* (head version and hash, the log
   positions, totals, the snapshot as stored, the bundle's path and SHA-256, the rows the
   projections held, sealed under the chain key), puts that same snapshot, byte for byte,
   in the snapshot table at its last version (the state it is read from now), and deletes
   the event rows.

A crash before the transaction leaves every row in place (and a bundle file nothing refers
to); after it, the base and the bundle hold everything. ``restore`` checks a bundle offline
(signature, chain, proofs), checks each stream's head against its sealed base, and puts
the rows back as they were: same versions, payloads, hashes, seals and log positions, and
the base's sealed snapshot at the head version.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from pathlib import Path, PurePath
from typing import Any, TypeVar
from uuid import UUID, uuid4

import psycopg
from eventsourcing.application import project_aggregate
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic
from psycopg.sql import SQL

from flowledger.domain.bounds import require_flag, shown
from flowledger.domain.errors import AuditError, ValidationError
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.session_views import SessionStatus
from flowledger.domain.values import require_count, require_name
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.store import Clock
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.paths import require_path
from flowledger.infrastructure.postgres.audit_arguments import require_needles, require_streams
from flowledger.infrastructure.postgres.bundles import export_bundle
from flowledger.infrastructure.postgres.checkpoints import AuditTrail
from flowledger.infrastructure.postgres.factory import FlowledgerSnapshotRecorder
from flowledger.infrastructure.postgres.retention import Base, RetentionTables
from flowledger.infrastructure.postgres.watchdog import watching
from flowledger.verify import event_mac

ProjectionRows = Callable[[Sequence[UUID]], dict[UUID, dict[str, Any]]]
"""Given archived streams, the rows each projection holds for each (``projections.retention``)."""
BeforeCommit = Callable[[psycopg.Connection[Any], int], None]
"""Called last in an archive batch's transaction (bases written, rows deleted) with the highest
log position it archives; raises to roll the batch back (``projections.retention.archive``)."""
BeforeRestore = Callable[[psycopg.Connection[Any], int], None]
"""Called in a restore's transaction, the bases held, with the highest log position it puts
back, before any row is written; raises to refuse (``projections.retention.restore``)."""

CLOSING_TOPICS = tuple(get_topic(c) for c in (Session.Completed, Session.Expired, Session.Abandoned))
CLOSED = frozenset({SessionStatus.COMPLETED, SessionStatus.EXPIRED, SessionStatus.ABANDONED})
STARTED_TOPIC = get_topic(Session.Started)
MAX_DAYS = 36_500
T = TypeVar("T")


MAX_BATCH = 100_000
"""The most sessions one archive bundle may hold."""


@dataclass
class WorkflowReport:
    """What one workflow's pass found and did."""

    workflow: str
    days: int
    sessions: list[str] = field(default_factory=list)
    """The session ids archived (or, in a dry run, that would be)."""
    events: int = 0
    bundles: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Session id -> why it was left alone (changed meanwhile, not closed)."""


@dataclass
class RetentionReport:
    """What ``archive`` found and did, per workflow."""

    dry_run: bool
    workflows: list[WorkflowReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def sessions(self) -> int:
        """Sessions archived (or that would be)."""
        return sum(len(w.sessions) for w in self.workflows)

    @property
    def events(self) -> int:
        """Event rows deleted (or that would be)."""
        return sum(w.events for w in self.workflows)


@dataclass(frozen=True)
class RestoreReport:
    """What ``restore`` put back."""

    sessions: tuple[str, ...]
    events: int
    skipped: dict[str, str]
    """Stream id -> why it was not restored (not archived now, or not wanted)."""
    skipped_sessions: dict[str, str] = field(default_factory=dict)
    """Stream id of ``skipped`` -> its session id, as a person knows the session (a stream whose
    session id could not be read is not in it)."""


class _WrittenMeanwhile(Exception):
    """Streams written while their batch was being archived (the batch's transaction rolls back)."""

    def __init__(self, streams: set[UUID]) -> None:
        super().__init__(f"{len(streams)} streams were written meanwhile")
        self.streams = streams


@dataclass(frozen=True)
class _Candidate:
    stream: UUID
    session: Session
    positions: tuple[int, ...]
    head_hash: bytes


class RetentionService:
    """Policies per workflow, archiving closed sessions to bundles, restoring them."""

    def __init__(
        self,
        app: FlowledgerApplication,
        trail: AuditTrail,
        tenant: str,
        clock: Clock,
    ) -> None:
        self._app = app
        self._trail = trail
        self._tenant = tenant
        self._clock = clock
        self.tables = RetentionTables(trail.schema, trail.names.events, trail.names.snapshots)
        self._events = trail.table(trail.names.events)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._trail.connect()
        self.tables.ensure(conn)
        conn.commit()
        return conn

    @contextmanager
    def _reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the trail's for a read inside an operation, watched until its end:
        it has no statement timeout (audit reads are long), and a read waiting on a lock held
        on retention's tables (or, behind PgBouncer in session pooling, for a server connection)
        waited for it, 40 s and more with a 3 s deadline."""
        with self._trail.connect() as conn, watching(conn):
            yield conn

    def _within_deadline(self, operation: str, call: Callable[[], T]) -> T:
        """``call()`` (a read, or a write that sets a value) tried again after a lost connection
        within the operation deadline, as the store's reads are; then StoreUnavailable.
        EngineClosed once the engine is closed: each call opens a connection of its own, so a
        closed engine had gone on setting policies and archiving."""
        self._app.ensure_open(operation)
        return within_deadline(operation, self._trail.settings.operation_deadline_s, call)

    def archived(self) -> dict[UUID, int]:
        """The archived streams, with the last version each one's base stands for (no tables: none)."""

        def read() -> dict[UUID, int]:
            with self._reading() as conn:
                if not self.tables.exists(conn):
                    return {}
                return {s: b.base.through_version for s, b in self.tables.bases(conn, b"").items()}

        return self._within_deadline("read archived sessions", read)

    def archived_naming(self, needles: Sequence[bytes]) -> list[UUID]:
        """This tenant's archived streams whose stored snapshot holds one of ``needles`` (a user
        id as an unsealed snapshot writes it; no tables: none). ``needles``: a list (or set) of
        non-empty byte strings, else a ValidationError before anything is read."""
        needles = require_needles("needles", needles)

        def read() -> list[UUID]:
            with self._reading() as conn:
                if not self.tables.exists(conn):
                    return []
                return self.tables.snapshots_holding(conn, self._tenant, needles)

        return self._within_deadline("read archived sessions", read)

    def archived_in(self, session_id: str) -> str | None:
        """The bundle an archived session's events are in (None: not archived)."""
        return self.bundles_of([session_uuid(self._tenant, session_id)]).get(
            session_uuid(self._tenant, session_id)
        )

    def archived_through(self, session_id: str) -> tuple[str, int] | None:
        """The bundle an archived session's events are in and the last version its base stands
        for (None: not archived)."""
        stream = session_uuid(self._tenant, session_id)

        def read() -> tuple[str, int] | None:
            with self._reading() as conn:
                if not self.tables.exists(conn):
                    return None
                found = self.tables.bases(conn, b"", [stream]).get(stream)
                return None if found is None else (found.base.bundle, found.base.through_version)

        return self._within_deadline("read archived sessions", read)

    def bundles_of(self, streams: Sequence[UUID]) -> dict[UUID, str]:
        """Which of ``streams`` are archived, with the bundle each one's events are in."""
        streams = require_streams("streams", streams)

        def read() -> dict[UUID, str]:
            with self._reading() as conn:
                if not self.tables.exists(conn):
                    return {}
                return {s: b.base.bundle for s, b in self.tables.bases(conn, b"", list(streams)).items()}

        return self._within_deadline("read archived sessions", read)

    # -- policies -------------------------------------------------------------------------

    def set_policy(self, workflow: str, days: int) -> None:
        """Archive ``workflow``'s closed sessions ``days`` days after their last event."""
        require_name("workflow", workflow)
        # A whole number: 1.5 had been stored as 2 (PostgreSQL rounds into the integer column),
        # "90" had raised TypeError and True a DatatypeMismatch.
        require_count("days", days, least=1, most=MAX_DAYS)

        def write() -> None:
            with self._connect() as conn:
                self.tables.set_policy(conn, self._tenant, workflow, days)

        self._within_deadline("set a retention policy", write)

    def delete_policy(self, workflow: str) -> bool:
        """Stop archiving ``workflow``; whether it had a policy."""
        require_name("workflow", workflow)

        def write() -> bool:
            with self._connect() as conn:
                return self.tables.delete_policy(conn, self._tenant, workflow)

        return self._within_deadline("delete a retention policy", write)

    def policies(self) -> dict[str, int]:
        """This tenant's policies: workflow -> days (reading makes no table)."""

        def read() -> dict[str, int]:
            with self._reading() as conn:
                if not self.tables.exists(conn):
                    return {}
                return self.tables.policies(conn, self._tenant)

        return self._within_deadline("read retention policies", read)

    # -- archiving ------------------------------------------------------------------------

    def archive(
        self,
        out_dir: str | Path,
        *,
        workflow: str | None = None,
        dry_run: bool = False,
        batch_size: int = 1000,
        projection_rows: ProjectionRows | None = None,
        before_commit: BeforeCommit | None = None,
    ) -> RetentionReport:
        """Archive every policy's due sessions (or one workflow's) into bundles under ``out_dir``
        (a path, or a string naming one), at most ``batch_size`` (1 to ``MAX_BATCH``) a bundle."""
        self._app.ensure_open("archive sessions")
        out_dir = require_path("out_dir", out_dir)
        _require_hook("projection_rows", projection_rows)
        _require_hook("before_commit", before_commit)
        # True or False only: None or 0 had archived for real (rows deleted), "no" counted only.
        require_flag("dry_run", dry_run)
        require_count("batch_size", batch_size, least=1, most=MAX_BATCH)
        started = time.perf_counter()
        policies = self.policies()
        if workflow is not None:
            require_name("workflow", workflow)  # a list had raised TypeError "unhashable type" below
            if workflow not in policies:
                raise ValidationError("workflow", f"no retention policy for workflow {workflow!r}")
            policies = {workflow: policies[workflow]}
        # Absolute: the bases name their bundle, for whoever reads them later, from anywhere.
        out_dir = out_dir.absolute()
        # Made before any row is touched (an unwritable directory fails first); one this run
        # made and left empty (nothing was due) is removed again.
        made = [] if dry_run else [d for d in (out_dir, *out_dir.parents) if not d.exists()]
        if not dry_run:
            out_dir.mkdir(parents=True, exist_ok=True)
        try:
            report = self._archive_due(out_dir, policies, dry_run, batch_size, projection_rows, before_commit)
        finally:
            for directory in made:  # innermost first
                if any(directory.iterdir()):
                    break
                directory.rmdir()
        report.seconds = time.perf_counter() - started
        return report

    def _archive_due(
        self,
        out_dir: Path,
        policies: dict[str, int],
        dry_run: bool,
        batch_size: int,
        projection_rows: ProjectionRows | None,
        before_commit: BeforeCommit | None,
    ) -> RetentionReport:
        report = RetentionReport(dry_run=dry_run)
        now = self._clock()
        for name, days in policies.items():
            part = WorkflowReport(name, days)
            report.workflows.append(part)
            cutoff = now - timedelta(days=days)
            after: UUID | None = None
            while True:
                streams = self._due(name, cutoff, after, batch_size)
                if not streams:
                    break
                after = streams[-1]
                candidates = self._load(streams, cutoff, part)
                if dry_run:
                    part.sessions += [c.session.session_id for c in candidates]
                    part.events += sum(len(c.positions) for c in candidates)
                elif candidates:
                    self._archive_batch(out_dir, name, candidates, part, projection_rows, before_commit)
        return report

    def _due(self, workflow: str, cutoff: datetime, after: UUID | None, limit: int) -> list[UUID]:
        """Streams of ``workflow`` whose last event closed the session before ``cutoff``."""
        query = SQL(
            "SELECT s.originator_id FROM {events} s"
            " CROSS JOIN LATERAL (SELECT e.topic, e.state FROM {events} e"
            "   WHERE e.originator_id = s.originator_id ORDER BY e.originator_version DESC LIMIT 1) l"
            " WHERE s.originator_version = 1 AND s.topic = %(started)s"
            " AND (%(after)s::uuid IS NULL OR s.originator_id > %(after)s::uuid)"
            " AND convert_from(s.state, 'UTF8')::jsonb ->> 'workflow' = %(workflow)s"
            " AND convert_from(s.state, 'UTF8')::jsonb ->> 'tenant' = %(tenant)s"
            " AND l.topic = ANY(%(closing)s)"
            " AND (convert_from(l.state, 'UTF8')::jsonb -> 'timestamp' ->> '_data_')::timestamptz"
            "   < %(cutoff)s"
            " ORDER BY s.originator_id LIMIT %(limit)s"
        ).format(events=self._events)
        params = {
            "started": STARTED_TOPIC,
            "after": after,
            "workflow": workflow,
            "tenant": self._tenant,
            "closing": list(CLOSING_TOPICS),
            "cutoff": cutoff,
            "limit": limit,
        }
        with self._trail.connect() as conn:
            return [row[0] for row in conn.execute(query, params).fetchall()]

    def _load(self, streams: Sequence[UUID], cutoff: datetime, part: WorkflowReport) -> list[_Candidate]:
        """The due sessions, folded from their events (one read for the batch), with the log
        positions of their events and their head hashes."""
        with self._trail.connect() as conn:
            rows = conn.execute(
                SQL(
                    "SELECT originator_id, originator_version, topic, state, notification_id, event_hash"
                    " FROM {} WHERE originator_id = ANY(%s) ORDER BY originator_id, originator_version"
                ).format(self._events),
                [list(streams)],
            ).fetchall()
        mapper = self._app.mapper
        found: list[_Candidate] = []
        for stream, group in groupby(rows, key=lambda r: r[0]):
            stored = list(group)
            versions = [int(r[1]) for r in stored]
            if versions != list(range(1, len(versions) + 1)):
                part.skipped[str(stream)] = (
                    f"its stored versions are not 1..{versions[-1]} (archived before and written since,"
                    " or rows missing: audit verify)"
                )
                continue
            head = stored[-1][5]
            if head is None:
                raise AuditError(
                    f"stream {stream} version {versions[-1]} has no chained hash:"
                    " run `flowledger audit chain` first"
                )
            events = [mapper.to_domain_event(StoredEvent(r[0], int(r[1]), r[2], bytes(r[3]))) for r in stored]
            session = project_aggregate(None, events)
            if not isinstance(session, Session):
                continue
            state = session.state()
            if state.status not in CLOSED or state.updated_at >= cutoff:
                part.skipped[state.session_id] = f"status {state.status}, last event {state.updated_at}"
                continue
            found.append(_Candidate(stream, session, tuple(int(r[4]) for r in stored), bytes(head)))
        return found

    def _archive_batch(
        self,
        out_dir: Path,
        workflow: str,
        candidates: list[_Candidate],
        part: WorkflowReport,
        projection_rows: ProjectionRows | None,
        before_commit: BeforeCommit | None,
    ) -> None:
        if self._app.snapshots is None:
            raise AuditError("retention needs snapshots (the engine's application has them switched off)")
        streams = [c.stream for c in candidates]
        rows = projection_rows(streams) if projection_rows is not None else {}
        path, digest = self._write_bundle(out_dir, workflow, streams)
        # A session written since it was read (its user forgotten, an expired one taken back to
        # init) is left for the next run: its base would keep the rows and the state of before
        # (the user's values, in the clear, after `forget` said they were erased).
        with self._trail.connect() as conn:
            written = self._written_since(conn, candidates)
        candidates = self._left_out(candidates, written, part)
        bases = [self._base(c, rows.get(c.stream, {}), path, digest) for c in candidates]
        deleted = 0
        while bases:
            try:
                deleted = self._store_bases(bases, before_commit)
                break
            except _WrittenMeanwhile as meanwhile:  # rolled back; again without them
                candidates = self._left_out(candidates, meanwhile.streams, part)
                bases = [b for b in bases if b.stream_id not in meanwhile.streams]
            except BaseException:
                path.unlink()  # rolled back: no base refers to it
                raise
        if not bases:
            path.unlink()  # no base refers to it
            return
        part.sessions += [b.session_id for b in bases]
        part.events += deleted
        part.bundles.append(str(path))

    def _base(self, c: _Candidate, rows: dict[str, Any], path: Path, digest: str) -> Base:
        snapshot = Session.Snapshot.take(c.session)  # type: ignore[attr-defined]
        stored = self._app.mapper.to_stored_event(snapshot)
        recorder = self._app.snapshots.recorder if self._app.snapshots is not None else None
        if isinstance(recorder, FlowledgerSnapshotRecorder) and recorder.seal is not None:
            stored = recorder.seal.sealed(stored)  # read from this row, as any snapshot is
        state = c.session.state()
        totals = state.totals
        return Base(
            stream_id=c.stream,
            tenant=state.tenant,
            workflow=state.workflow,
            session_id=state.session_id,
            status=str(state.status),
            through_version=c.session.version,
            head_hash=c.head_hash,
            positions=c.positions,
            last_event_at=state.updated_at.isoformat(),
            totals={
                "steps": state.step_count,
                "failures": state.failure_count,
                "calls": totals.calls,
                "input_tokens": totals.input_tokens,
                "output_tokens": totals.output_tokens,
                "cache_read_input_tokens": totals.cache_read_input_tokens,
                "reasoning_output_tokens": totals.reasoning_output_tokens,
                "audio_input_tokens": totals.audio_input_tokens,
                "audio_output_tokens": totals.audio_output_tokens,
                "cache_creation_input_tokens": totals.cache_creation_input_tokens,
                "cache_creation_1h_input_tokens": totals.cache_creation_1h_input_tokens,
                "cost_usd": str(totals.cost_usd),
            },
            snapshot_topic=stored.topic,
            snapshot_state=stored.state,
            projection_rows=rows,
            bundle=str(path),
            bundle_sha256=digest,
        )

    def _store_bases(self, bases: list[Base], before_commit: BeforeCommit | None) -> int:
        """One transaction: the bases, their snapshots, the rows deleted; the rows deleted.
        ``_WrittenMeanwhile`` (rolled back) when a stream has an event past its base's head."""
        streams = [b.stream_id for b in bases]
        with self._trail.connect() as conn, conn.transaction():
            self.tables.insert_bases(conn, bases, self._trail.chain_key)
            # The snapshot an archived session is read from is the one its base seals, byte for
            # byte (put through the mapper again, its personal fields would be sealed anew).
            self.tables.put_snapshots(conn, bases)
            deleted = conn.execute(
                SQL(
                    "DELETE FROM {} e USING unnest(%s::uuid[], %s::bigint[]) AS a(id, v)"
                    " WHERE e.originator_id = a.id AND e.originator_version <= a.v"
                ).format(self._events),
                [streams, [b.through_version for b in bases]],
            ).rowcount
            expected = sum(len(b.positions) for b in bases)
            if deleted != expected:
                raise AuditError(f"archive deleted {deleted} rows, expected {expected}: nothing was deleted")
            # Checked last, so that only an append committing in the instant before this
            # transaction does escapes it (and `forget` checks again after its own append).
            written = self._written_since(conn, bases)
            if written:
                raise _WrittenMeanwhile(written)
            if before_commit is not None:
                before_commit(conn, max(max(b.positions) for b in bases))
        return deleted

    def _written_since(self, conn: psycopg.Connection[Any], heads: Sequence[_Candidate | Base]) -> set[UUID]:
        """The streams with an event stored past the version read (a candidate's, a base's)."""
        ids = [h.stream if isinstance(h, _Candidate) else h.stream_id for h in heads]
        versions = [h.session.version if isinstance(h, _Candidate) else h.through_version for h in heads]
        rows = conn.execute(
            SQL(
                "SELECT DISTINCT e.originator_id FROM {} e JOIN unnest(%s::uuid[], %s::bigint[]) AS a(id, v)"
                " ON e.originator_id = a.id AND e.originator_version > a.v"
            ).format(self._events),
            [ids, versions],
        ).fetchall()
        return {row[0] for row in rows}

    @staticmethod
    def _left_out(candidates: list[_Candidate], streams: set[UUID], part: WorkflowReport) -> list[_Candidate]:
        """``candidates`` but those of ``streams``, named in ``part.skipped``."""
        for c in candidates:
            if c.stream in streams:
                part.skipped[c.session.session_id] = (
                    "written while it was being archived: left for the next run"
                )
        return [c for c in candidates if c.stream not in streams]

    def _write_bundle(self, out_dir: Path, workflow: str, streams: list[UUID]) -> tuple[Path, str]:
        """Export, verify and link the bundle of ``streams``; its path and SHA-256."""
        stamp = self._clock().strftime("%Y%m%dT%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self._tenant}-{workflow}")[:80]
        path = out_dir / f"{safe}-{stamp}-{streams[0].hex[:12]}.jsonl"
        # A name of its own for the file being written (another run may write into out_dir too).
        # (O_EXCL, the mode the umask leaves, as a file opened for writing gets it)
        temporary = path.with_name(f"{path.stem}.{uuid4().hex[:12]}.partial")
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                summary = export_bundle(self._trail, out, streams)
                out.flush()
                os.fsync(out.fileno())
            text = temporary.read_bytes()
            checked = self._trail.checked_bundle(text.decode("utf-8").splitlines())
            if not checked.ok or checked.streams != len(streams) or checked.events != summary.events:
                first = checked.problems[0] if checked.problems else "it does not hold every stream"
                raise AuditError(f"the bundle just written does not verify ({first}); nothing was archived")
            return _link_new(temporary, path), hashlib.sha256(text).hexdigest()
        finally:
            # A half-written file (a full disk, an export refused) is not left behind either.
            temporary.unlink(missing_ok=True)

    # -- restoring ------------------------------------------------------------------------

    def restore(
        self,
        bundle: str | Path,
        sessions: Sequence[str] | None = None,
        *,
        before_insert: BeforeRestore | None = None,
    ) -> RestoreReport:
        """Put the archived events in ``bundle`` (a path, or a string naming one) back (of
        ``sessions`` only, when given)."""
        self._app.ensure_open("restore sessions")
        bundle = require_path("bundle", bundle)
        _require_hook("before_insert", before_insert)
        # Before the bundle is read: "s-1" had been read as the sessions 's', '-' and '1'.
        if sessions is not None and (isinstance(sessions, str) or not isinstance(sessions, list | tuple)):
            raise ValidationError("sessions", f"must be a list of session ids, got {shown(sessions)}")
        if sessions is not None and not sessions:
            # It had read and checked the whole bundle, then said "none of [] is archived in" it.
            raise ValidationError(
                "sessions", "names no session: give one or more (None restores every session of the bundle)"
            )
        try:
            raw = bundle.read_bytes()
            lines = raw.decode("utf-8").splitlines()
        except OSError as error:
            raise ValidationError("bundle", f"cannot read {bundle}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise ValidationError("bundle", f"{bundle} is not UTF-8 text") from None
        digest = hashlib.sha256(raw).hexdigest()
        checked = self._trail.checked_bundle(lines)
        if not checked.ok:
            first = checked.problems[0] if checked.problems else "it holds no stream"
            raise AuditError(f"bundle {bundle} does not verify: {first}")
        events, heads = _read_bundle(lines)
        wanted = None if sessions is None else {session_uuid(self._tenant, s) for s in sessions}
        key = self._trail.chain_key
        restored: list[str] = []
        streams: list[UUID] = []
        restoring: list[Base] = []
        rows: list[tuple[Any, ...]] = []
        with self._connect() as conn:
            # Held until the rows are in: a second restore of the bundle waits here, then finds
            # its streams restored already (both had inserted the rows: a UniqueViolation).
            bases = self.tables.bases(conn, key, list(heads), for_update=True)
            skipped = self._left_alone(conn, bundle, heads, set(bases), wanted)
            for stream, (version, hashed) in heads.items():
                if str(stream) in skipped:
                    continue
                stored = bases[stream]
                base = stored.base
                if not stored.sealed:
                    raise AuditError(
                        f"the base of stream {stream} is not sealed by the chain key: not restored"
                    )
                if base.tenant != self._tenant:
                    raise ValidationError(
                        "tenant",
                        f"{bundle.name} holds sessions of tenant {base.tenant!r}, not {self._tenant!r}:"
                        " nothing restored (restore it with that tenant)",
                    )
                if (base.through_version, base.head_hash) != (version, hashed):
                    raise AuditError(
                        f"stream {stream}: the bundle's head (version {version}) is not the one its base"
                        f" keeps (version {base.through_version}): not restored"
                    )
                if not hmac.compare_digest(digest, base.bundle_sha256):
                    # Named by its session: a session restored alone and archived again is in a
                    # later bundle, and this one (its first) was refused naming only a stream id.
                    archived_to = PurePath(base.bundle).name
                    raise AuditError(
                        f"session {base.session_id!r} (stream {stream}): {bundle.name} is not the file it"
                        f" was archived to ({archived_to}, SHA-256 {base.bundle_sha256[:16]}...;"
                        f" this file's is {digest[:16]}...): nothing restored (restore that session from"
                        f" {archived_to}, and this file's others with --session)"
                    )
                mine = events[stream]
                if tuple(e[4] for e in mine) != base.positions:
                    raise AuditError(f"stream {stream}: the bundle's log positions differ from its base's")
                name = str(stream)
                rows += [
                    (stream, v, topic, state, position, hashed, event_mac(key, name, v, hashed))
                    for v, topic, state, hashed, position in mine
                ]
                restored.append(base.session_id)
                streams.append(stream)
                restoring.append(base)
            if wanted is not None and not wanted & heads.keys():
                # Sessions of the bundle restored already are reported as such (skipped): a
                # restore of them run twice is harmless, as the whole bundle's is.
                raise ValidationError("session", f"none of {sorted(sessions or ())} is archived in {bundle}")
            absent = sorted(s for s in sessions or () if session_uuid(self._tenant, s) not in heads)
            if absent:
                # One mistyped among several was passed over: "restored 1 sessions", exit 0.
                raise ValidationError(
                    "session", f"{bundle} holds no session {', '.join(map(repr, absent))}: nothing restored"
                )
            if before_insert is not None and rows:
                before_insert(conn, max(row[4] for row in rows))
            with conn.transaction(), conn.cursor() as cur:
                self.tables.delete_bases(conn, streams)  # first: the guard refuses rows a base holds
                # The sealed snapshot goes back too: one edited while archived would otherwise
                # stay the state the restored session is read from.
                self.tables.put_snapshots(conn, restoring)
                cur.executemany(
                    SQL(
                        "INSERT INTO {} (originator_id, originator_version, topic, state, notification_id,"
                        " transaction_id, event_hash, event_mac) VALUES (%s, %s, %s, %s, %s, '0', %s, %s)"
                    ).format(self._events),
                    rows,
                )
        named = _session_ids(self._tenant, {UUID(s): events.get(UUID(s), []) for s in skipped})
        for stream in (UUID(s) for s in skipped if UUID(s) not in named and UUID(s) in bases):
            if bases[stream].sealed:  # its events unreadable as JSON: its base keeps the id too
                named[stream] = bases[stream].base.session_id
        return RestoreReport(tuple(restored), len(rows), skipped, {str(s): name for s, name in named.items()})

    def _left_alone(
        self,
        conn: psycopg.Connection[Any],
        bundle: Path,
        heads: dict[UUID, tuple[int, bytes]],
        archived: set[UUID],
        wanted: set[UUID] | None,
    ) -> dict[str, str]:
        """Why each of the bundle's streams that is not restored is left alone (not asked for, or
        restored already: its head event is stored); ValidationError, before anything is
        written, for a stream neither archived nor stored here (another schema or database: a
        restore there had reported "restored 0 sessions" and exited 0)."""
        skipped = {str(s): "not asked for" for s in heads if wanted is not None and s not in wanted}
        missing = {s: h for s, h in heads.items() if str(s) not in skipped and s not in archived}
        stored = self.tables.stored_heads(conn, missing)
        unknown = sorted((s for s in missing if s not in stored), key=str)
        if unknown:
            raise ValidationError(
                "bundle",
                f"{bundle.name}: {len(unknown)} of its streams (the first {unknown[0]}) are neither archived"
                f" nor stored in schema {self._trail.schema!r} (another schema or database? if their rows"
                " were deleted, see audit verify): nothing restored",
            )
        skipped |= {str(s): "restored already: its events are stored up to the bundle's head" for s in stored}
        return skipped


def _link_new(temporary: Path, path: Path) -> Path:
    """Link ``temporary`` into place as ``path``, or as ``path-2``, ``-3``... when a file has
    that name (the caller drops the temporary name). Never over a file: one with that name may be the
    bundle other archived sessions are still in (a session of it restored alone and archived
    again in the same second made the same name, and its new bundle replaced the old one)."""
    candidate, number = path, 1
    while True:
        try:
            os.link(temporary, candidate)
        except FileExistsError:
            number += 1
            candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
            continue
        return candidate


def _require_hook(field_name: str, value: object) -> None:
    """Raise ValidationError unless ``value`` is None or a function: ``projection_rows=5`` had
    raised "'int' object is not callable" from inside the run (or never, with nothing due)."""
    if value is not None and not callable(value):
        raise ValidationError(field_name, f"must be a function (or None), got {shown(value)}")


def _session_ids(
    tenant: str, events: dict[UUID, list[tuple[int, str, bytes, bytes, int]]]
) -> dict[UUID, str]:
    """Each stream's session id, read from its first event in the bundle (``Session.Started``
    holds it) when it is the id of that stream in ``tenant``: what a person reads in a restore's
    report, not the stream id (``left out stream 13f06d71-...: not asked for``)."""
    named: dict[UUID, str] = {}
    for stream, mine in events.items():
        first = next((state for version, _, state, _, _ in mine if version == 1), None)
        try:
            data = json.loads(first) if first is not None else None
        except (ValueError, RecursionError):
            continue
        name = data.get("session_id") if isinstance(data, dict) else None
        if not isinstance(name, str):
            continue
        try:
            if session_uuid(tenant, name) == stream:
                named[stream] = name
        except ValidationError:
            continue
    return named


def _read_bundle(
    lines: Sequence[str],
) -> tuple[dict[UUID, list[tuple[int, str, bytes, bytes, int]]], dict[UUID, tuple[int, bytes]]]:
    """A verified bundle's events per stream (version, topic, state, hash, position) and heads."""
    events: dict[UUID, list[tuple[int, str, bytes, bytes, int]]] = {}
    heads: dict[UUID, tuple[int, bytes]] = {}
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record["type"] == "event":
            state = record["state"].encode() if "state" in record else base64.b64decode(record["state_b64"])
            events.setdefault(UUID(record["stream"]), []).append(
                (
                    int(record["version"]),
                    str(record["topic"]),
                    state,
                    bytes.fromhex(record["hash"]),
                    int(record["position"]),
                )
            )
        elif record["type"] == "head":
            heads[UUID(record["stream"])] = (int(record["version"]), bytes.fromhex(record["hash"]))
    return events, heads
