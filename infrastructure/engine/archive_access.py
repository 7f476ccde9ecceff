"""A tenant's access to the audit trail and retention (``Engine.audit``, ``Engine.retention``,
``archive_sessions``, ``restore_sessions``): the retention service is built at first use, and
both refuse an in-memory engine and a closed one."""

from __future__ import annotations

from pathlib import Path

from flowledger.domain.bounds import shown
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.retention import (
    BeforeCommit,
    BeforeRestore,
    ProjectionRows,
    RestoreReport,
    RetentionReport,
    RetentionService,
)
from flowledger.infrastructure.engine.store import Clock
from flowledger.infrastructure.paths import require_path
from flowledger.infrastructure.postgres.checkpoints import AuditTrail


class ArchiveAccess:
    """The audit trail of one store and one tenant's retention over it."""

    def __init__(
        self, app: FlowledgerApplication, audit: AuditTrail | None, tenant: str, clock: Clock
    ) -> None:
        self._app = app
        self._audit = audit
        self._tenant = tenant
        self._clock = clock
        self._retention: RetentionService | None = None

    @property
    def keeps_archives(self) -> bool:
        """Whether sessions can be archived at all (PostgreSQL, where the audit trail is)."""
        return self._audit is not None

    def audit(self) -> AuditTrail:
        """``Engine.audit``: EngineClosed once closed; ValidationError in memory."""
        self._app.ensure_open("audit")
        if self._audit is None:
            raise ValidationError(
                "audit", "the audit chain needs PostgreSQL (this engine keeps events in memory)"
            )
        return self._audit

    def retention(self) -> RetentionService:
        """``Engine.retention``: built once, at first use."""
        if self._retention is None:
            self._retention = RetentionService(self._app, self.audit(), self._tenant, self._clock)
        return self._retention

    def archive(
        self,
        out_dir: str | Path,
        workflow: str | None,
        dry_run: bool,
        batch_size: int,
        projection_rows: ProjectionRows | None,
        before_commit: BeforeCommit | None,
    ) -> RetentionReport:
        """``Engine.archive_sessions``, ``out_dir`` checked first."""
        return self.retention().archive(
            require_path("out_dir", out_dir),
            workflow=workflow,
            dry_run=dry_run,
            batch_size=batch_size,
            projection_rows=projection_rows,
            before_commit=before_commit,
        )

    def restore(
        self, bundle: str | Path, sessions: list[str] | None, before_insert: BeforeRestore | None
    ) -> RestoreReport:
        """``Engine.restore_sessions``, the list of sessions and the bundle's path checked first."""
        if sessions is not None and (isinstance(sessions, str) or not isinstance(sessions, list | tuple)):
            raise ValidationError("sessions", f"must be a list of session ids, got {shown(sessions)}")
        return self.retention().restore(require_path("bundle", bundle), sessions, before_insert=before_insert)
