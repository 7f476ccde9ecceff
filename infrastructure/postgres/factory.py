"""The event library's PostgreSQL factory, with flowledger's recorders for the event log.

``library_env`` selects it by topic (``PERSISTENCE_MODULE``). Snapshots and tracking
keep the library's recorders; the application and process recorders append through
``FlowledgerApplicationRecorder`` (see its module for the mechanism).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import (
    ApplicationRecorder,
    InterfaceError,
    OperationalError,
    ProcessRecorder,
    StoredEvent,
    Tracking,
)
from eventsourcing.postgres import PostgresDatastore, PostgresFactory, PostgresProcessRecorder
from eventsourcing.utils import Environment, EnvType, retry

from flowledger.infrastructure.postgres.notify import Notifier
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder


class FlowledgerProcessRecorder(PostgresProcessRecorder, FlowledgerApplicationRecorder):
    """Events and the upstream tracking position, written in one transaction."""

    def __init__(
        self,
        datastore: PostgresDatastore,
        *,
        events_table_name: str = "stored_events",
        tracking_table_name: str = "notification_tracking",
    ):
        super().__init__(
            datastore, tracking_table_name=tracking_table_name, events_table_name=events_table_name
        )

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Append events and record ``tracking`` (if given) atomically."""
        tracking: Tracking | None = kwargs.get("tracking")
        if tracking is None:
            plain: Sequence[int] | None = FlowledgerApplicationRecorder.insert_events(self, stored_events)
            return plain
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            # The append must be the transaction's first write (it takes the id).
            ids = self.append(curs, stored_events) if stored_events else []
            self._insert_tracking(curs, tracking)
        if ids:
            self.notifier.poke()
        return ids


class FlowledgerPostgresFactory(PostgresFactory):
    """``PostgresFactory`` whose event log is appended without a table lock."""

    application_recorder_class = FlowledgerApplicationRecorder
    process_recorder_class = FlowledgerProcessRecorder

    def __init__(self, env: Environment | EnvType | None):
        super().__init__(env)
        self._notifiers: list[Notifier] = []

    def application_recorder(self) -> ApplicationRecorder:
        """The event log's recorder; its notifier is stopped when the factory closes."""
        recorder = super().application_recorder()
        self._keep_notifier(recorder)
        return recorder

    def process_recorder(self) -> ProcessRecorder:
        """As ``application_recorder``, with tracking."""
        recorder = super().process_recorder()
        self._keep_notifier(recorder)
        return recorder

    def close(self) -> None:
        """Stop the notifiers (they hold connections of their own), then the pool."""
        for notifier in self._notifiers:
            notifier.close()
        self._notifiers.clear()
        super().close()

    def _keep_notifier(self, recorder: object) -> None:
        if isinstance(recorder, FlowledgerApplicationRecorder):
            self._notifiers.append(recorder.notifier)
