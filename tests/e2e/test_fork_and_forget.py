"""Fork and forget at the edges: ``flowledger fork`` / ``forget`` and ``POST /v1/sessions/{id}/fork``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Simulator
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli
from tests.support.simulated import simulated_client


@pytest.fixture
def http(engine: Engine, simulator: Simulator) -> Iterator[TestClient]:
    """The open app (no keys configured) over the parametrised engine, its model the simulator
    (which counts the calls it gets) through the real client."""
    engine.llm = simulated_client(simulator.base_url)
    with TestClient(create_app(engine)) as client:
        yield client


def test_rest_fork_starts_a_linked_session_and_replays_never_call_the_model(
    http: TestClient, simulator: Simulator
) -> None:
    http.post("/v1/sessions", json={"session_id": "h-1", "workflow": "cs", "user_id": "u-1"})
    http.post("/v1/sessions/h-1/process", json={"step": "classify", "input": {"m": "hi"}, "model": "gpt-4.1"})
    calls = simulator.stats["requests"]

    forked = http.post("/v1/sessions/h-1/fork", json={"at_version": 1, "new_session_id": "h-2"})
    replayed = [http.get("/v1/sessions/h-1", params={"version": v}) for v in (1, 2, 3)]
    retried = http.post(
        "/v1/sessions/h-2/process", json={"step": "classify", "input": {"m": "hi"}, "model": "deepseek-v3.2"}
    )

    assert forked.status_code == 201, forked.text
    body = forked.json()
    assert (body["forked_from"], body["forked_at_version"], body["version"]) == ("h-1", 1, 2)
    assert (body["user_id"], body["current_step"], body["totals"]["calls"]) == ("u-1", "init", 0)
    assert [r.status_code for r in replayed] == [200, 200, 200]
    assert retried.status_code == 201
    assert simulator.stats["requests"] == calls + 1  # the retry only: forking and replaying called nothing


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/sessions/nobody/fork", {"at_version": 1, "new_session_id": "n"}, 404, "'nobody' not found"),
        ("/v1/sessions/h-1/fork", {"at_version": 5, "new_session_id": "n"}, 422, "has 1 version, not 5"),
        ("/v1/sessions/h-1/fork", {"at_version": 0, "new_session_id": "n"}, 422, "at_version"),
        ("/v1/sessions/h-1/fork", {"at_version": 1, "new_session_id": "h-1"}, 409, "already exists"),
        ("/v1/sessions/h-1/fork", {"at_version": 1}, 422, "new_session_id"),
        ("/v1/sessions/h-1/fork", {"at_version": 1, "new_session_id": ""}, 422, "new_session_id"),
    ],
)
def test_rest_fork_of_bad_input_is_a_4xx_with_a_message_and_appends_nothing(
    http: TestClient, engine: Engine, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    http.post("/v1/sessions", json={"session_id": "h-1", "workflow": "cs"})
    head = engine.log.head()

    response = http.post(path, json=body)

    assert response.status_code == status, response.text
    assert response.json()["success"] is False
    assert message in response.json()["error"]
    assert engine.log.head() == head


def test_the_openapi_document_lists_the_fork_and_every_status_it_answers(http: TestClient) -> None:
    operation = http.get("/openapi.json").json()["paths"]["/v1/sessions/{session_id}/fork"]["post"]
    assert {"200", "201", "404", "409", "422", "401", "403"} <= set(operation["responses"])


def test_cli_fork_and_forget(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, quick_purge: None
) -> None:
    monkeypatch.setenv("FLOWLEDGER_SEAL_PERSONAL_DATA", "1")  # the CLI's engines seal too
    sealed = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=sealed) as engine:
        engine.start_session("c-1", "cs", user_id="dave", metadata={"email": "dave@example.org"})
        engine.record_step("c-1", "greet", input={"message": "I am Dave"}, context_update={"name": "Dave"})

    forked = run_cli(database_url, pg_schema, "fork", "c-1", "2", "c-2")
    forgotten = run_cli(database_url, pg_schema, "forget", "dave")
    replay = run_cli(database_url, pg_schema, "replay", "c-2")

    assert forked.returncode == 0, forked.stderr
    assert "session c-2 at version 2" in forked.stdout
    assert "Dave" in forked.stdout
    assert forgotten.returncode == 0, forgotten.stderr
    assert "erased 2 sessions (c-1, c-2); 2 data keys destroyed" in forgotten.stdout
    assert replay.returncode == 0, replay.stderr
    assert "Dave" not in replay.stdout
    assert ERASED_TEXT in replay.stdout
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.get_session("c-1").context == ERASED_JSON


def test_cli_forget_of_a_user_whose_sessions_were_recorded_unsealed_says_they_stay_in_the_clear(
    database_url: str, pg_schema: str
) -> None:
    # Given two sessions of frank's recorded without sealing (the default)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("u-2", "cs", user_id="frank")
        engine.start_session("u-1", "cs", user_id="frank", metadata={"email": "frank@example.org"})

    # When frank is forgotten
    result = run_cli(database_url, pg_schema, "forget", "frank")

    # Then nothing could be erased and it exits 2 (as `forget --session` of an unsealed session
    # does), one line naming the sessions that stay in the clear
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout.strip() == "erased 0 sessions (none); 0 data keys destroyed"
    assert result.stderr.strip().splitlines() == [
        "error: user_id: 2 sessions of 'frank' were recorded without sealing and stay in the clear"
        " (u-1, u-2): no key to destroy"
    ]


def test_cli_forget_of_a_session_a_second_time_reports_it_already_erased(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a sealed session of gina's, forgotten once
    monkeypatch.setenv("FLOWLEDGER_SEAL_PERSONAL_DATA", "1")
    sealed = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=sealed) as engine:
        engine.start_session("g-1", "cs", user_id="gina")
    first = run_cli(database_url, pg_schema, "forget", "--session", "g-1")

    # When it is forgotten again
    again = run_cli(database_url, pg_schema, "forget", "--session", "g-1")

    # Then the second run erased nothing and says so
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "erased 1 sessions (g-1); 1 data keys destroyed"
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "erased 0 sessions (none; already erased: g-1); 0 data keys destroyed"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("fork", "nobody", "1", "x-1"), 3, "'nobody' not found"),
        (("fork", "c-1", "9", "x-1"), 2, "has 1 version, not 9"),
        (("fork", "c-1", "1", "c-1"), 4, "already exists"),
        (("fork", "c-1", "1", "x-1", "--ttl-hours", "0"), 2, "ttl_hours: must be a positive number of hours"),
        (("fork", "c-1", "1", "x-1", "--ttl-hours", "8785"), 2, "ttl_hours: must be at most 8784 (366 days)"),
        (
            ("fork", "c-1", "1", "x-1", "--ttl-hours", "1e-12"),
            2,
            "ttl_hours: must be at least 1 ms (2.78e-07 hours)",
        ),
        (("forget",), 2, "user_id: give a user id, or --session SESSION\n"),
        (("forget", "erin", "--session", "c-1"), 2, "not both"),
        (("forget", "--session", "nobody"), 3, "'nobody' not found"),
    ],
)
def test_cli_fork_and_forget_of_bad_input_print_one_line_and_append_nothing(
    database_url: str, pg_schema: str, args: tuple[str, ...], code: int, message: str
) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("c-1", "cs", user_id="erin")
        head = engine.log.head()

    result = run_cli(database_url, pg_schema, *args)

    assert result.returncode == code, (result.stdout, result.stderr)
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.log.head() == head


def test_rest_fork_sent_again_answers_200_as_a_start_sent_again_does(
    http: TestClient, engine: Engine
) -> None:
    # Given a fork whose answer the client lost
    http.post("/v1/sessions", json={"session_id": "r-1", "workflow": "cs"})
    first = http.post("/v1/sessions/r-1/fork", json={"at_version": 1, "new_session_id": "r-2"})
    head = engine.log.head()

    # When it is sent again
    again = http.post("/v1/sessions/r-1/fork", json={"at_version": 1, "new_session_id": "r-2"})

    # Then it is answered 200 with the fork as it stands (201 before: "created" where nothing was),
    # and nothing is appended
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json() == first.json()
    assert engine.log.head() == head
