"""Two engines on one PostgreSQL schema with short step leases: the lease tests' pair."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flowledger.infrastructure import Engine
from tests.conftest import make_settings


@contextmanager
def two_engines(database_url: str, schema: str, lease_s: float) -> Iterator[tuple[Engine, Engine]]:
    """Two engines on ``schema`` whose steps hold ``lease_s``-second leases; closed afterwards."""
    settings = make_settings(database_url=database_url, schema=schema, step_lease_s=lease_s)
    first, second = Engine(settings=settings), Engine(settings=settings)
    try:
        yield first, second
    finally:
        first.close()
        second.close()
