"""Shared fixtures: a PostgreSQL URL, a fresh schema per test, engines on both backends.

PostgreSQL comes from FLOWLEDGER_TEST_DATABASE_URL when set, else the server at
127.0.0.1:5432, else an embedded server started for the test run. Never skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema
from flowledger.infrastructure.postgres.embedded import embedded_database_url

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PostgreSQL URL for the whole run."""
    configured = os.environ.get("FLOWLEDGER_TEST_DATABASE_URL")
    if configured:
        return configured
    if _reachable(LOCAL_SERVER):
        return LOCAL_SERVER
    return embedded_database_url(Path(tmp_path_factory.mktemp("embedded-pg")))


@pytest.fixture
def pg_schema(database_url: str) -> Iterator[str]:
    """A schema of the test's own, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield schema
    drop_schema(database_url, schema)


def make_settings(**overrides: object) -> Settings:
    """Test settings that ignore the developer's environment."""
    return Settings(home=Path("/nonexistent")).with_overrides(**overrides)


@pytest.fixture
def pg_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """An engine on real PostgreSQL, in its own schema."""
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    yield engine
    engine.close()


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The same test body against the in-memory and the PostgreSQL backend."""
    if request.param == "memory":
        memory = Engine(settings=make_settings(database_url="memory:"))
        yield memory
        memory.close()
    else:
        yield request.getfixturevalue("pg_engine")
