"""The batch processor: reads notifications in batches, decodes them once, lets each projection
write its rows, and moves each projection's tracking position in the same transaction.

Exactly once, no gaps: a batch's rows and positions commit together or not at all; the
tracking rows are locked (FOR UPDATE) for the batch, and every projection skips events at
or below its stored position, so concurrent followers or a restart never count twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import ApplicationRecorder, Mapper, Notification
from psycopg import Connection, Cursor

from flowledger.domain.errors import ValidationError
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.calls import call_of
from flowledger.projections.catalog import Names, active_schemas, install
from flowledger.projections.sql import q

Progress = Callable[[int], None]
"""Called after each batch with the last notification id applied."""
BatchHook = Callable[[int], None]
"""Called inside each batch's transaction, after its rows are written and before it commits."""


@dataclass(frozen=True)
class Target:
    """A projection and the build schema its rows go to."""

    projection: Projection
    schema: str


Resolve = Callable[[Cursor[Any]], list[Target]]
"""Works out the targets of a batch inside its transaction (live builds are locked FOR SHARE)."""


class Projector:
    """Runs projections over one event store's log."""

    def __init__(
        self,
        *,
        database_url: str,
        store_schema: str,
        recorder: ApplicationRecorder,
        mapper: Mapper[UUID],
        projections: Sequence[Projection],
        batch_size: int = 2000,
    ) -> None:
        if batch_size < 1:
            raise ValidationError("batch_size", f"must be >= 1, got {batch_size}")
        self.database_url = database_url
        self.names = Names(store_schema)
        self.recorder = recorder
        self.mapper = mapper
        self.projections = list(projections)
        self.batch_size = batch_size

    def connect(self) -> Connection[Any]:
        """A new autocommit connection; transactions are opened explicitly."""
        return psycopg.connect(self.database_url, autocommit=True)

    def select(self, wanted: Sequence[str] | None) -> list[Projection]:
        """The projections named in ``wanted`` (all when None); unknown names raise ValidationError."""
        if not wanted:
            return list(self.projections)
        by_name = {p.name: p for p in self.projections}
        missing = [name for name in wanted if name not in by_name]
        if missing:
            raise ValidationError("projection", f"unknown projection(s) {missing}; known: {sorted(by_name)}")
        return [by_name[name] for name in wanted]

    def live(self, projections: Sequence[Projection]) -> Resolve:
        """Targets that follow whichever build is live when each batch runs."""
        by_name = {p.name: p for p in projections}

        def resolve(cur: Cursor[Any]) -> list[Target]:
            schemas = active_schemas(cur, self.names, list(by_name), lock=True)
            return [Target(by_name[name], schema) for name, schema in schemas.items()]

        return resolve

    def catch_up(
        self,
        wanted: Sequence[str] | None = None,
        *,
        progress: Progress | None = None,
        on_batch: BatchHook | None = None,
        max_batches: int | None = None,
    ) -> int:
        """Bring the live builds up to the head of the log; return how many notifications were read."""
        projections = self.select(wanted)
        with self.connect() as conn:
            install(conn, self.names, projections)
            return self.drive(
                conn, self.live(projections), progress=progress, on_batch=on_batch, max_batches=max_batches
            )

    def positions(self, cur: Cursor[Any], schemas: Sequence[str], *, lock: bool = False) -> dict[str, int]:
        """Tracking positions of builds (locked FOR UPDATE with ``lock``)."""
        statement = "SELECT schema_name, position FROM {s}.builds WHERE schema_name = ANY(%s)"
        statement += " ORDER BY schema_name FOR UPDATE" if lock else ""
        cur.execute(q(statement, self.names.control), [list(schemas)])
        return {row[0]: int(row[1]) for row in cur.fetchall()}

    def drive(
        self,
        conn: Connection[Any],
        resolve: Resolve,
        *,
        stop: int | None = None,
        progress: Progress | None = None,
        on_batch: BatchHook | None = None,
        max_batches: int | None = None,
    ) -> int:
        """Apply batches until the log (up to ``stop``) is exhausted; return notifications read."""
        read = batches = 0
        while max_batches is None or batches < max_batches:
            with conn.cursor() as cur:
                targets = resolve(cur)
                if not targets:
                    break
                after = min(self.positions(cur, [t.schema for t in targets]).values(), default=0)
            if stop is not None and after >= stop:
                break
            notifications = self.recorder.select_notifications(
                start=after + 1, limit=self.batch_size, stop=stop
            )
            if not notifications:
                break
            if self.run_batch(conn, resolve, notifications, after=after, on_batch=on_batch):
                read += len(notifications)
                batches += 1
                if progress is not None:
                    progress(notifications[-1].id)
        return read

    def run_batch(
        self,
        conn: Connection[Any],
        resolve: Resolve,
        notifications: Sequence[Notification],
        *,
        after: int,
        on_batch: BatchHook | None = None,
    ) -> bool:
        """Apply ``notifications`` (the log's next ones after id ``after``) in one transaction.

        Returns False, writing nothing, if some target's position is behind ``after``
        (its build changed since the batch was read): the caller reads again.
        """
        with conn.transaction(), conn.cursor() as cur:
            targets = resolve(cur)
            positions = self.positions(cur, [t.schema for t in targets], lock=True)
            if any(positions.get(t.schema, -1) < after for t in targets):
                return False
            ids = [n.id for n in notifications]
            first = bisect_right(ids, min(positions.values(), default=0))
            decode = self.mapper.to_domain_event
            envelopes = [
                Envelope(n.id, event, call_of(event)) for n in notifications[first:] for event in (decode(n),)
            ]
            last = ids[-1]
            for target in targets:
                position = positions[target.schema]
                todo = envelopes[bisect_right(ids, position) - first :]
                if todo:
                    target.projection.apply(cur, target.schema, todo)
                if last > position:
                    cur.execute(
                        q(
                            "UPDATE {s}.builds SET position = %s, events = events + %s,"
                            " updated_at = now() WHERE schema_name = %s",
                            self.names.control,
                        ),
                        [last, len(todo), target.schema],
                    )
            if on_batch is not None:
                on_batch(last)
        return True
