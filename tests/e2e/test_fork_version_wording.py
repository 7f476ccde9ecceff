"""A fork's ``at_version`` out of range is refused over REST in the library's words: ``POST
/v1/sessions/{id}/fork`` with ``at_version`` 0 said ``at_version: must be at least 1 (got 0)``
and 2**31 ``must be at most 2147483647 (got 2147483648)`` (pydantic's bounds in the HTTP
layer's words) where ``Engine.fork_session`` and ``flowledger fork s 0 n`` say ``at_version:
must be a version >= 1, got 0`` and ``session 's' has 2 versions, not 2147483648``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

VERSIONS = [0, -1, 2**31, 2**40]


@pytest.fixture
def served() -> Iterator[tuple[Engine, TestClient]]:
    """An in-memory engine with a session of two versions, and REST over it."""
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.start_session("s", "w")
    engine.record_step("s", "a", input={}, output={})
    with TestClient(create_app(engine)) as client:
        yield engine, client
    engine.close()


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_rest_refuses_a_fork_version_out_of_range_in_the_librarys_words(
    served: tuple[Engine, TestClient], version: int
) -> None:
    engine, client = served
    with pytest.raises(ValidationError) as refused:
        engine.fork_session("s", version, "lib-fork", timedelta(hours=1))

    response = client.post("/v1/sessions/s/fork", json={"at_version": version, "new_session_id": "rest-fork"})

    assert response.status_code == 422, response.text
    assert response.json()["error"] == str(refused.value)
    assert client.get("/v1/sessions/rest-fork").status_code == 404  # nothing created
