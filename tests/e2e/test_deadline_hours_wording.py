"""A deadline given in hours out of range is refused in one set of words at every entry point.

REST said ``deadline_hours: must be at least 0.001 (got 0)`` and ``must be at most 87840 (got
1000000000)`` (its schema's bounds in the HTTP layer's words) where the CLI's
``--deadline-hours`` said ``must be a positive number of hours, got 0`` and ``must be at most
87840 (3660 days), got 1e+09``; both now say what ``domain.hours.deadline_delay`` says.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.hours import deadline_delay

OUT_OF_RANGE = [0, -1, 0.0001, 87_841, 1e9]


def domain_words(hours: float) -> str:
    """What the domain says of ``hours`` (the one wording every entry point should give)."""
    with pytest.raises(ValidationError) as refused:
        deadline_delay(hours)
    return str(refused.value)


@pytest.mark.parametrize("hours", OUT_OF_RANGE, ids=repr)
def test_rest_refuses_a_task_deadline_in_hours_out_of_range_in_the_domains_words(
    memory_http: TestClient, hours: float
) -> None:
    body = {"task_id": "t-1", "description": "d", "deadline_hours": hours}
    response = memory_http.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(hours)
    assert memory_http.get("/v1/tasks/t-1").status_code == 404  # nothing recorded


@pytest.mark.parametrize("hours", OUT_OF_RANGE, ids=repr)
def test_rest_refuses_a_requeue_deadline_in_hours_out_of_range_in_the_domains_words(
    memory_http: TestClient, hours: float
) -> None:
    body = {"reason": "r", "requested_by": "ann", "deadline_hours": hours}
    response = memory_http.post("/v1/tasks/t-1/requeue", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(hours)


def test_the_words_are_those_the_command_line_quotes() -> None:
    # (tests/e2e/test_cli_tasks.py checks the CLI's lines; these are the same words)
    assert domain_words(0) == "deadline_hours: must be a positive number of hours, got 0"
    assert domain_words(0.0001) == "deadline_hours: must be at least 3.6 s (0.001 hours), got 0.0001"
    assert domain_words(87_841) == "deadline_hours: must be at most 87840 (3660 days), got 87841"


def test_an_hours_deadline_in_range_is_a_delay() -> None:
    assert deadline_delay(1.5).total_seconds() == 5_400
