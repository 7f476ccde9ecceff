"""A task listing's or queue run's ``limit`` and a classification's ``estimated_hours`` out of
range are refused in one set of words at every entry point: the domain's.

REST said ``limit: must be at least 1 (got 0)`` for a queue run and ``query.limit: must be at
most 1000 (got '1001')`` for a listing (its schema's bounds in the HTTP layer's words) where
the library and the CLI said ``limit: must be in [1, 1000], got 0``; it said ``estimated_hours:
must be above 0 (got 0)`` where the CLI's ``--hours 0`` said ``must be above 0, got 0.0``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.task_checks import require_limit
from flowledger.domain.task_views import Classification

LIMITS = [0, -1, 1001, 10**9]
HOURS: list[Any] = [0, -1, -2.5, 10_001, 10_000.5, 1e9, 1e300]


def limit_words(limit: int) -> str:
    """What the domain says of ``limit`` (the one wording every entry point should give)."""
    with pytest.raises(ValidationError) as refused:
        require_limit(limit)
    return str(refused.value)


def hours_words(hours: float) -> str:
    with pytest.raises(ValidationError) as refused:
        Classification(category="bug_fix", complexity="high", estimated_hours=hours)
    return str(refused.value)


@pytest.mark.parametrize("limit", LIMITS, ids=repr)
def test_rest_refuses_a_queue_run_limit_out_of_range_in_the_domains_words(
    memory_http: TestClient, limit: int
) -> None:
    response = memory_http.post("/v1/queue/run", json={"limit": limit})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == limit_words(limit)


@pytest.mark.parametrize("limit", LIMITS, ids=repr)
def test_rest_refuses_a_listing_limit_out_of_range_in_the_domains_words(
    memory_http: TestClient, limit: int
) -> None:
    response = memory_http.get("/v1/tasks", params={"limit": limit})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == limit_words(limit)


@pytest.mark.parametrize("hours", HOURS, ids=repr)
def test_rest_refuses_an_estimate_out_of_range_in_the_domains_words(
    memory_http: TestClient, hours: float
) -> None:
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "Fix the bug"})
    body = {"category": "bug_fix", "complexity": "high", "estimated_hours": hours}
    response = memory_http.post("/v1/tasks/t-1/classification", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == hours_words(hours)
    assert memory_http.get("/v1/tasks/t-1").json()["classification"] is None  # nothing recorded


@pytest.mark.parametrize("hours", [0, -1, 10_001, 1e9], ids=repr)
def test_an_estimate_is_said_alike_whether_it_came_as_a_whole_number_or_as_a_float(hours: float) -> None:
    # (The CLI reads --hours 0 as 0.0: it said "got 0.0" where REST, sent 0, said "got 0".)
    assert hours_words(hours) == hours_words(float(hours))


def test_the_words_are_those_the_command_line_quotes() -> None:
    # (tests/e2e/test_cli_tasks.py and test_cli_recorded_classification.py check the CLI's lines)
    assert limit_words(0) == "limit: must be in [1, 1000], got 0"
    assert limit_words(1001) == "limit: must be in [1, 1000], got 1001"
    assert hours_words(0.0) == "estimated_hours: must be above 0, got 0"
    assert hours_words(10_000.5) == "estimated_hours: must be at most 10000, got 10000.5"
    assert hours_words(1e9) == "estimated_hours: must be at most 10000, got 1000000000"
