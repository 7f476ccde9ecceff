"""The event-library application behind the Engine: persistence, transcodings, snapshots."""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import JSONTranscoder
from eventsourcing.utils import Environment, EnvType

from flowledger.domain.session import Session
from flowledger.infrastructure.transcodings import register_transcodings


class FlowledgerApplication(Application[UUID]):
    """Stores flowledger's aggregates; configured only by the env it is given."""

    name = "flowledger"
    snapshotting_intervals: ClassVar[dict[type, int]] = {Session: 50}  # type: ignore[misc]

    def __init__(self, env: EnvType, snapshot_interval: int = 50) -> None:
        self._snapshot_interval = snapshot_interval
        super().__init__(env)
        self.snapshotting_intervals = {Session: snapshot_interval}  # type: ignore[misc]

    def construct_env(self, name: str, env: EnvType | None = None) -> Environment:
        """Unlike the library, ignore ``os.environ``: Settings already read it once."""
        values = dict(env or {})
        values["IS_SNAPSHOTTING_ENABLED"] = "y"
        return Environment(name, values)

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        """The library's transcodings plus flowledger's value objects."""
        super().register_transcodings(transcoder)
        register_transcodings(transcoder)
