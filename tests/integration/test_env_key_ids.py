"""The id of a key given in ``FLOWLEDGER_API_KEYS`` (what the access log and every event's
``actor`` show) is an HMAC of its secret under the installation's salt, kept in the database:
it was the secret's bare SHA-256 (``env-`` and 10 hex digits), so an operator's secret
(``acme-writer-2026``) was found from a stored event's actor by hashing guesses."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from flowledger.adapters.cli.main import app as cli
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import Keyring
from flowledger.domain.aggregate import actor_of
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

SECRET = "acme-writer-2026"
"""A secret an operator chose: 16 characters, the least taken."""
UNSALTED = "env-" + hashlib.sha256(SECRET.encode()).hexdigest()[:10]


@pytest.fixture
def keyed(database_url: str, pg_schema: str) -> Iterator[Engine]:
    settings = make_settings(
        database_url=database_url, schema=pg_schema, api_keys=(("default", "writer", SECRET),)
    )
    engine = Engine(settings=settings)
    try:
        yield engine
    finally:
        engine.close()


def _key_id(engine: Engine) -> str:
    keys = Keyring.of(engine)
    try:
        found = keys.static.find(SECRET)
        assert found is not None
        return found.key_id
    finally:
        keys.close()


def test_an_events_actor_is_no_bare_hash_of_the_environment_keys_secret(keyed: Engine) -> None:
    # Given a server whose key is given in the environment
    with TestClient(create_app(keyed, require_keys=True)) as http:
        # When it writes a session
        made = http.post(
            "/v1/sessions", json={"session_id": "s1", "workflow": "w"}, headers={"X-API-Key": SECRET}
        )
    assert made.status_code == 201, made.text
    # Then the event records the key's id, which no hash of a guessed secret gives
    (actor,) = {actor_of(event) for event in keyed.log.stream(keyed.session_uuid("s1"))}
    assert actor == _key_id(keyed)
    assert actor != UNSALTED
    assert hashlib.sha256(SECRET.encode()).hexdigest()[:10] not in actor


def test_an_environment_keys_id_stays_across_restarts_and_differs_between_installations(
    keyed: Engine, database_url: str, pg_schema: str
) -> None:
    first = _key_id(keyed)
    # A restart (another keyring, another engine on the same schema) names the key alike
    again = Engine(settings=keyed.settings)
    try:
        assert _key_id(again) == first
    finally:
        again.close()
    # Another installation (another schema) names the same secret otherwise
    other_schema = f"{pg_schema}_other"
    other = Engine(
        settings=make_settings(
            database_url=database_url, schema=other_schema, api_keys=keyed.settings.api_keys
        )
    )
    try:
        assert _key_id(other) != first
    finally:
        other.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {other_schema} CASCADE")


def test_revoking_an_environment_key_by_its_former_id_names_its_id_now(
    keyed: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an id recorded before ids were salted (events keep it): the key is still told
    for name, value in {
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": pg_schema,
        "FLOWLEDGER_API_KEYS": f"default:writer:{SECRET}",
    }.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["keys", "revoke", UNSALTED])
    assert result.exit_code == 3, result.output
    assert _key_id(keyed) in result.output
    assert "FLOWLEDGER_API_KEYS" in result.output
