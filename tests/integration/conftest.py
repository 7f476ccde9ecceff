"""Fixtures shared by integration modules: an engine on a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.clock import SetClock

CLOCK_START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
"""Where ``clock`` starts."""


@pytest.fixture
def clock() -> SetClock:
    """The clock of ``clocked_engine``, at ``CLOCK_START`` until the test moves it."""
    return SetClock(CLOCK_START)


@pytest.fixture
def clocked_engine(database_url: str, pg_schema: str, clock: SetClock) -> Iterator[Engine]:
    """An engine on PostgreSQL and ``clock``, snapshotting every 3 events (retention and audit tests)."""
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=3)
    with Engine(settings=settings, clock=clock) as engine:
        yield engine
