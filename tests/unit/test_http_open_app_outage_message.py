"""An app that runs open (no API key exists) and meets a database outage while it checks
whether a key exists now tells the caller what failed, the request's own call, not
"(api keys)": the caller sent no key, and keys are no part of what it asked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http import auth as auth_module
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import Keyring
from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

DETAIL = "couldn't get a connection after 3.00 sec"


@pytest.fixture
def open_app() -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine)) as client:  # open: no key exists
        yield client
    engine.close()


def test_an_outage_met_by_the_open_apps_key_check_names_the_request_not_api_keys(
    open_app: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an open app whose check for a key now meets the database's outage
    def unreachable(self: Keyring) -> bool:
        raise StoreUnavailable("api keys", DETAIL)

    monkeypatch.setattr(Keyring, "any_configured", unreachable)
    monkeypatch.setattr(auth_module, "OPEN_RECHECK_S", 0.0)
    # When a request comes, the check being due
    response = open_app.get("/v1/agents")
    # Then it is the database's 503, naming the request (it said "the event store is
    # unavailable (api keys): ...", to a caller that sent no key)
    assert response.status_code == 503
    told = response.json()["error"]
    assert "api keys" not in told.lower()
    assert told == f"the event store is unavailable (GET /v1/agents): {DETAIL}"
    assert response.headers["Retry-After"] == "1"


def test_an_outage_met_by_a_key_check_says_the_key_of_which_request_was_being_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a server that requires keys, whose key table is unreachable
    def unreachable(self: Keyring, token: str) -> None:
        raise StoreUnavailable("api keys", DETAIL)

    engine = Engine(settings=make_settings(database_url="memory:"))
    monkeypatch.setattr(Keyring, "find", unreachable)
    with TestClient(create_app(engine, require_keys=True)) as client:
        response = client.get("/v1/agents", headers={"Authorization": "Bearer fl_" + "a" * 40})
    engine.close()
    # Then the 503 says what was being done (it said "(api keys)")
    assert response.status_code == 503
    assert response.json()["error"] == (
        f"the event store is unavailable (checking the API key of GET /v1/agents): {DETAIL}"
    )
