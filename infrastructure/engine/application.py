"""The event-library application behind the Engine: persistence, transcodings, snapshots."""

from __future__ import annotations

import contextlib
from typing import ClassVar
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import JSONTranscoder, Mapper
from eventsourcing.postgres import PostgresFactory
from eventsourcing.utils import Environment, EnvType

from flowledger.domain.agent import Agent
from flowledger.domain.errors import EngineClosed
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.infrastructure.postgres.data_keys import PostgresDataKeys
from flowledger.infrastructure.postgres.ddl import TableNames
from flowledger.infrastructure.sealing import DataKeys, MemoryDataKeys, SealingMapper
from flowledger.infrastructure.transcodings import register_transcodings


class FlowledgerApplication(Application[UUID]):
    """Stores flowledger's aggregates; configured only by the env it is given."""

    name = "flowledger"
    snapshotting_intervals: ClassVar[dict[type, int]] = {  # type: ignore[misc]
        Session: 50,
        Task: 50,
        Agent: 50,
    }

    def __init__(
        self,
        env: EnvType,
        snapshot_interval: int = 50,
        *,
        seal_personal_data: bool = False,
        data_key_cache_s: float = 30.0,
    ) -> None:
        self._snapshot_interval = snapshot_interval
        self._seal = seal_personal_data
        self._key_cache_s = data_key_cache_s
        self.data_keys: DataKeys = MemoryDataKeys()
        self.closed = False
        """Set by ``close``: every read and write of the engine is then refused (EngineClosed)."""
        try:
            super().__init__(env)
        except BaseException:
            self._close_half_built()
            raise
        warm_idle = getattr(self.factory, "warm_idle", None)
        if warm_idle is not None:  # PostgreSQL: the first reads find their statements prepared
            warm_idle()
        self.snapshotting_intervals = {  # type: ignore[misc]
            Session: snapshot_interval,
            Task: snapshot_interval,
            Agent: snapshot_interval,
        }

    def close(self) -> None:
        """Close the recorder's connections; from then on ``ensure_open`` refuses."""
        self.closed = True
        super().close()

    def _close_half_built(self) -> None:
        """Close the factory of a constructor that failed, here and now: left to ``__del__``,
        its pool was closed wherever the garbage collector ran, once from one of the pool's own
        threads (an "Exception ignored in Application.__del__" a later test was blamed for)."""
        self.closed = True
        factory = getattr(self, "factory", None)
        if factory is not None:
            with contextlib.suppress(Exception):  # the constructor's own error is the one to see
                factory.close()

    def __del__(self) -> None:
        """Close an application nobody closed; one already closed is left alone."""
        if not getattr(self, "closed", True):
            super().__del__()

    def ensure_open(self, operation: str) -> None:
        """Raise EngineClosed once the application is closed: its pool would otherwise be
        retried as an unreachable database until the operation's deadline (StoreUnavailable),
        and an in-memory store would go on answering."""
        if self.closed:
            raise EngineClosed(operation)

    def construct_env(self, name: str, env: EnvType | None = None) -> Environment:
        """Unlike the library, ignore ``os.environ``: Settings already read it once."""
        values = dict(env or {})
        values["IS_SNAPSHOTTING_ENABLED"] = "y"
        return Environment(name, values)

    def construct_mapper(self) -> Mapper[UUID]:
        """The mapper that seals personal fields under each session's data key (``sealing.py``),
        with the step events encoded by orjson (``fast_json.py``)."""
        factory = self.factory
        if isinstance(factory, PostgresFactory):
            self.data_keys = PostgresDataKeys(
                factory.datastore,
                factory.datastore.schema,
                TableNames.for_app(self.name).snapshots,
                self._key_cache_s,
            )
        return SealingMapper(super().construct_mapper(), keys=self.data_keys, seal=self._seal)

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        """The library's transcodings plus flowledger's value objects."""
        super().register_transcodings(transcoder)
        register_transcodings(transcoder)
