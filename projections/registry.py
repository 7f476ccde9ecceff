"""The projections flowledger maintains, and a projector wired to an engine."""

from __future__ import annotations

from collections.abc import Sequence

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.engine.facade import Engine
from flowledger.infrastructure.settings import MEMORY_URL
from flowledger.projections.base import Projection
from flowledger.projections.catalog import tenant_reader
from flowledger.projections.cost import CostDashboard
from flowledger.projections.current_state import CurrentState
from flowledger.projections.funnel import CompletionFunnel
from flowledger.projections.processor import Projector
from flowledger.projections.seed import SeedTables


def all_projections() -> list[Projection]:
    """Every projection, in the order they are applied."""
    return [CurrentState(), CostDashboard(), CompletionFunnel(), SeedTables()]


def projector_for(
    engine: Engine, *, batch_size: int = 2000, projections: Sequence[Projection] | None = None
) -> Projector:
    """A projector over ``engine``'s log; it reads through the engine's recorder and mapper, and
    checks archived sessions' bases under the engine's chain key (``archived.py``)."""
    if engine.database_url == MEMORY_URL:
        raise ValidationError(
            "database_url", "projections are PostgreSQL tables: the engine needs a PostgreSQL database"
        )
    return Projector(
        database_url=engine.database_url,
        store_schema=engine.settings.schema,
        recorder=engine.log.recorder,
        mapper=engine.log.mapper,
        projections=all_projections() if projections is None else projections,
        batch_size=batch_size,
        read_url=engine.settings.read_database_url,
        pgbouncer=engine.settings.pgbouncer,
        deadline_s=engine.settings.operation_deadline_s,
        connect_timeout_s=engine.settings.connect_deadline_s,
        chain_key=lambda: engine.audit.chain_key,
    )


def tenant_views(projector: Projector, tenant: str) -> str:
    """A schema of views showing only ``tenant``'s rows of every read model (see ``tenant_reader``)."""
    with projector.connect() as conn:
        return tenant_reader(conn, projector.names, projector.projections, tenant, key=projector.chain_key)
