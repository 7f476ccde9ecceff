"""Writers that kept losing the race get a 503 that says when to try again (``Retry-After``)
and names the bound they passed; a client could not tell that 503 from a fault to give up on."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.errors import headers_for
from flowledger.domain.errors import ConcurrentUpdate
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def test_a_write_that_ran_out_of_conflict_retries_is_a_503_with_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.start_session("s-1", "customer_service")

    def outrun(*_: object, **__: object) -> None:
        raise ConcurrentUpdate("s-1", 65, 64)

    monkeypatch.setattr(engine.sessions, "record_step", outrun)
    with TestClient(create_app(engine, require_keys=False)) as client:
        response = client.post("/v1/sessions/s-1/steps", json={"step": "greet"})
    engine.close()
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert "max_conflict_retries, 64: FLOWLEDGER_MAX_CONFLICT_RETRIES" in response.json()["error"]


def test_the_header_does_not_need_the_bound() -> None:
    assert headers_for(ConcurrentUpdate("s-1", 3)) == {"Retry-After": "1"}
    assert "max_conflict_retries" not in str(ConcurrentUpdate("s-1", 3))
