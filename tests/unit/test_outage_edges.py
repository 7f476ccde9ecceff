"""A database connection error that escapes the engine's own handling is still an outage at the
edges: HTTP 503 with Retry-After (not 500), exit 75 (not 70), as ``StoreUnavailable`` is; a
refused login stays ``StoreRefused`` (503, exit 1)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import typer
from eventsourcing import persistence
from fastapi.testclient import TestClient
from psycopg_pool import PoolTimeout

from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

ESCAPED = [
    persistence.OperationalError("couldn't get a connection after 5.00 sec"),
    persistence.InterfaceError("the connection is closed"),
    psycopg.OperationalError("connection failed: Connection refused"),
    psycopg.InterfaceError("the connection is lost"),
    PoolTimeout("couldn't get a connection after 5.00 sec"),
]
REFUSED = psycopg.OperationalError('connection failed: FATAL:  role "nobody" does not exist')


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    app = create_app(engine, require_keys=False)

    def fail() -> None:
        raise app.state.error

    app.add_api_route("/boom", fail)
    with TestClient(app) as test_client:
        yield test_client
    engine.close()


@pytest.mark.parametrize("error", ESCAPED, ids=lambda e: type(e).__module__ + "." + type(e).__name__)
def test_an_escaped_connection_error_is_a_503_with_retry_after(client: TestClient, error: Exception) -> None:
    client.app.state.error = error  # type: ignore[attr-defined]
    response = client.get("/boom")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"].startswith("the event store is unavailable (GET /boom): ")


def test_an_escaped_refused_login_is_a_503_that_says_so(client: TestClient) -> None:
    client.app.state.error = REFUSED  # type: ignore[attr-defined]
    response = client.get("/boom")
    assert response.status_code == 503
    assert "the database refused the connection" in response.json()["error"]


def _exit_code(error: Exception) -> int:
    with pytest.raises(typer.Exit) as ended, reported_errors():
        raise error
    return ended.value.exit_code


@pytest.mark.parametrize("error", ESCAPED, ids=lambda e: type(e).__module__ + "." + type(e).__name__)
def test_an_escaped_connection_error_exits_75(error: Exception, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(error) == 75
    assert "error: the event store is unavailable (command): " in capsys.readouterr().err


def test_an_escaped_refused_login_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(REFUSED) == 1
    assert "the database refused the connection" in capsys.readouterr().err
