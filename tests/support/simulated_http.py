"""The HTTP API over an engine whose model is the built-in simulator, on either backend: the
body of the ``http`` fixture the task tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.simulated import simulated_client


def simulated_http(request: pytest.FixtureRequest, simulator: Simulator) -> Iterator[TestClient]:
    """A TestClient of the app over a new engine: in memory for the ``memory`` parameter, else
    in the test's own PostgreSQL schema; the engine calls ``simulator``."""
    if request.param == "memory":
        settings = make_settings(database_url="memory:")
    else:
        settings = make_settings(
            database_url=request.getfixturevalue("database_url"), schema=request.getfixturevalue("pg_schema")
        )
    engine = Engine(settings=settings, llm=simulated_client(simulator.base_url))
    with TestClient(create_app(engine)) as client:
        yield client
    engine.close()
