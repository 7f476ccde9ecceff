"""A session's abandon reason and an expiry sweep's limit are refused in the domain's words at
every entry point. REST said ``reason: must be text that is not blank and holds no NUL (got
'   ')`` and ``must be at most 1000 characters, got 1001`` (its schema's pattern and a bound of
its own: a reason of 1,001 to 2,000 characters, which the library takes, was refused) where
``Engine.abandon_session`` says ``reason: must be a non-empty string``; and ``POST
/v1/expiry/sweep`` said ``limit: must be at least 1 (got 0)`` where ``flowledger
expire-sessions --limit 0`` says ``limit: must be a whole number from 1 to 100000, got 0`` (the
library's ``expire_overdue`` checked nothing: a limit of -1 reached PostgreSQL)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.bounds import MAX_REASON_LENGTH, require_text
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from flowledger.projections.expiry import expire_overdue
from tests.support.cli import run_cli

REASONS = {"empty": "", "blank": "   ", "nul": "gave\x00up", "too long": "x" * (MAX_REASON_LENGTH + 1)}
LIMITS = [0, -1, 100_001]


def domain_words(reason: str) -> str:
    """What the domain says of an abandon ``reason`` (``Session.abandon``'s rule)."""
    with pytest.raises(ValidationError) as refused:
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
    return str(refused.value)


@pytest.mark.parametrize("reason", REASONS.values(), ids=list(REASONS))
def test_rest_refuses_an_abandon_reason_in_the_domains_words(memory_http: TestClient, reason: str) -> None:
    # Given an active session
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # When it is abandoned for a reason the domain refuses, then REST says what the library says
    response = memory_http.post("/v1/sessions/s-1/abandon", json={"reason": reason})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(reason)
    assert memory_http.get("/v1/sessions/s-1").json()["status"] == "active"  # nothing recorded


def test_rest_takes_an_abandon_reason_as_long_as_the_library_takes(memory_http: TestClient) -> None:
    # (1,001 to 2,000 characters was a 422, "must be at most 1000 characters, got 1001")
    reason = "y" * MAX_REASON_LENGTH
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    response = memory_http.post("/v1/sessions/s-1/abandon", json={"reason": reason})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "abandoned"


@pytest.mark.parametrize("limit", LIMITS, ids=str)
def test_a_sweep_limit_out_of_range_is_refused_in_one_wording(
    memory_http: TestClient, pg_engine: Engine, database_url: str, pg_schema: str, limit: int
) -> None:
    # When REST, the command line and the library are each given the limit
    response = memory_http.post("/v1/expiry/sweep", json={"limit": limit})
    shown = run_cli(database_url, pg_schema, "expire-sessions", "--limit", str(limit))
    with pytest.raises(ValidationError) as refused:
        expire_overdue(pg_engine, projector_for(pg_engine), limit=limit)

    # Then each refuses it, in the same words
    assert (response.status_code, shown.returncode) == (422, 2), response.text
    words = response.json()["error"]
    assert words == str(refused.value)
    assert words in shown.stderr
