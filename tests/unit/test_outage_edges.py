"""A database connection error that escapes the engine's own handling is still an outage at the
edges: HTTP 503 with Retry-After (not 500), exit 75 (not 70), as ``StoreUnavailable`` is; a
refused login stays ``StoreRefused`` (503, exit 1)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
import typer
from eventsourcing import persistence
from fastapi.testclient import TestClient
from psycopg_pool import PoolTimeout

from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.infrastructure.outages import within_deadline
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


def test_a_call_tried_until_its_deadline_says_for_how_long() -> None:
    # A wrong port answered "Connection refused" after the whole deadline, which read as a hang
    def refused() -> None:
        raise psycopg.OperationalError("connection failed: Connection refused")

    with pytest.raises(StoreUnavailable) as failed:
        within_deadline("read", 0.3, refused)
    assert re.fullmatch(r"connection failed: Connection refused \(tried for 0\.\d s\)", failed.value.detail)
    # a refused login is not tried again, so it says nothing of time
    with pytest.raises(StoreRefused) as refused_login:
        within_deadline("read", 5.0, lambda: (_ for _ in ()).throw(REFUSED))
    assert "tried for" not in str(refused_login.value)
