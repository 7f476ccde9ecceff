"""``POST /v1/expiry/sweep``: the tenant's overdue sessions recorded as expired, over HTTP."""

from __future__ import annotations

import time
from datetime import timedelta

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine


def test_the_sweep_expires_overdue_sessions_and_a_session_reads_expired_before_it(pg_engine: Engine) -> None:
    pg_engine.start_session("gone", "wf", ttl=timedelta(milliseconds=1))
    pg_engine.start_session("here", "wf", ttl=timedelta(hours=1))
    time.sleep(0.05)
    with TestClient(create_app(pg_engine)) as client:
        before = client.get("/v1/sessions/gone").json()
        swept = client.post("/v1/expiry/sweep")
        cut = client.post("/v1/expiry/sweep", json={"limit": 1})
        bodies = ({"limit": 0}, {"limit": "5"}, {"x": 1})
        refused = [client.post("/v1/expiry/sweep", json=body) for body in bodies]

    assert before["status"] == "expired"
    assert swept.status_code == 200, swept.text
    assert swept.json() == {"expired": ["gone"], "examined": 1, "complete": True}
    assert cut.json() == {"expired": [], "examined": 0, "complete": True}
    assert [r.status_code for r in refused] == [422, 422, 422]
    assert "limit" in refused[0].text


def test_the_sweep_on_an_in_memory_engine_is_422(memory_http: TestClient) -> None:
    answer = memory_http.post("/v1/expiry/sweep")

    assert answer.status_code == 422
    assert "PostgreSQL" in answer.text
