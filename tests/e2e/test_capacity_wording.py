"""An agent's capacity out of range is refused in the domain's words at every entry point.

REST said ``capacity: must be at least 1 (got 0)`` (its schema's bound, in the words the HTTP
layer gives pydantic's bounds) where the library and the CLI say the domain's ``capacity: must be
an int in [1, 10000], got 0``, and the README quotes that wording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.agent import MIN_REGISTERED_CAPACITY, require_capacity
from flowledger.infrastructure import Engine


def domain_words(capacity: int, at_least: int) -> str:
    """What the domain says of ``capacity`` (the one wording every entry point should give)."""
    with pytest.raises(ValidationError) as refused:
        require_capacity(capacity, at_least=at_least)
    return str(refused.value)


def register(capacity: int) -> Callable[[TestClient], Any]:
    body = {"agent_id": "a-1", "name": "A", "skills": ["python"], "capacity": capacity}
    return lambda client: client.post("/v1/agents", json=body)


def change(capacity: int) -> Callable[[TestClient], Any]:
    def send(client: TestClient) -> Any:
        client.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["python"]})
        return client.put("/v1/agents/a-1/capacity", json={"capacity": capacity})

    return send


@pytest.mark.parametrize(
    ("send", "capacity", "at_least"),
    [
        (register(0), 0, MIN_REGISTERED_CAPACITY),
        (register(10_001), 10_001, MIN_REGISTERED_CAPACITY),
        (change(-1), -1, 0),
        (change(10_001), 10_001, 0),
    ],
    ids=["register 0", "register 10001", "change to -1", "change to 10001"],
)
def test_rest_refuses_a_capacity_out_of_range_in_the_domains_words(
    memory_http: TestClient, send: Callable[[TestClient], Any], capacity: int, at_least: int
) -> None:
    response = send(memory_http)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(capacity, at_least)


def test_the_library_refuses_a_registration_capacity_of_zero_in_the_domains_words() -> None:
    engine = Engine(database_url="memory:")
    try:
        with pytest.raises(ValidationError) as refused:
            engine.register_agent("a-1", "A", ["python"], capacity=0)
        assert str(refused.value) == "capacity: must be an int in [1, 10000], got 0"
    finally:
        engine.close()
