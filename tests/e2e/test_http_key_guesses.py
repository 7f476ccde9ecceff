"""Refused keys per client address: past ``http_auth_failures`` in a window, 429 before any
lookup, for guesses and a valid key from that address alike; other addresses unaffected; the
count bounded in memory (``adapters/http/guesses.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import Keyring
from flowledger.adapters.http.guesses import Guesses, source_of
from flowledger.adapters.simulator import Simulator
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.keys import ApiKey, StaticKeys
from tests.e2e.live_http import ACME_WRITER, GLOBEX_WRITER, KEYS, bearer, keyed_engine, live_server

GUESS = "flk_abcdefghijkl_" + "g" * 43


class CountingKeyring(Keyring):
    """The test keys, counting every lookup (each one a database query for a stored key)."""

    def __init__(self) -> None:
        super().__init__(StaticKeys(KEYS, salt=b"test salt"), None)
        self.lookups = 0
        self._counting = threading.Lock()  # lookups run in the server's worker threads

    def find(self, token: str) -> ApiKey | None:
        with self._counting:
            self.lookups += 1
        return super().find(token)


@pytest.fixture
def keyring() -> CountingKeyring:
    return CountingKeyring()


@pytest.fixture
def app(simulator: Simulator, keyring: CountingKeyring) -> Iterator[FastAPI]:
    engine = keyed_engine(simulator, http_auth_failures=3, http_auth_failure_window_s=60.0)
    yield create_app(engine, require_keys=True, keys=keyring)
    engine.close()


def client_at(app: FastAPI, address: str) -> TestClient:
    return TestClient(app, client=(address, 40000), raise_server_exceptions=False)


def test_past_the_limit_an_address_is_answered_429_without_a_lookup_valid_key_or_not(
    app: FastAPI, keyring: CountingKeyring
) -> None:
    attacker, neighbour = client_at(app, "203.0.113.7"), client_at(app, "198.51.100.9")
    # Given three guesses from one address, each looked up and refused
    for _ in range(3):
        assert attacker.get("/v1/agents", headers=bearer(GUESS)).status_code == 401
    assert keyring.lookups == 3
    # When it sends a fourth guess, and then a valid key
    guess = attacker.get("/v1/agents", headers=bearer(GUESS))
    valid = attacker.get("/v1/agents", headers=bearer(ACME_WRITER))
    # Then both are 429 with Retry-After (the window's rest), and neither was looked up
    for refused in (guess, valid):
        assert refused.status_code == 429, refused.text
        assert refused.json() == {
            "success": False,
            "error": "too many refused API keys from this address: retry later",
        }
        assert 55 <= int(refused.headers["retry-after"]) <= 60
    assert keyring.lookups == 3
    # And nothing was written by a blocked writer
    blocked = attacker.post(
        "/v1/sessions", json={"session_id": "s1", "workflow": "cs"}, headers=bearer(ACME_WRITER)
    )
    assert blocked.status_code == 429
    assert neighbour.get("/v1/sessions/s1", headers=bearer(ACME_WRITER)).status_code == 404
    # And another address is served, its own guesses still looked up and answered 401
    assert neighbour.get("/v1/agents", headers=bearer(ACME_WRITER)).status_code == 200
    assert neighbour.get("/v1/agents", headers=bearer(GUESS)).status_code == 401


def test_one_tenants_refused_keys_do_not_lock_out_a_key_already_serving_from_the_same_address(
    app: FastAPI, keyring: CountingKeyring
) -> None:
    # Given one Dify server calling for two tenants: globex's key in use from its address
    dify = client_at(app, "203.0.113.20")
    assert dify.get("/v1/agents", headers=bearer(GLOBEX_WRITER)).status_code == 200
    # When acme's workflow there sends keys that are no key's, past the limit (a typo, or on purpose)
    for _ in range(3):
        assert dify.get("/v1/agents", headers=bearer(GUESS)).status_code == 401
    assert dify.get("/v1/agents", headers=bearer(GUESS)).status_code == 429
    lookups = keyring.lookups
    # Then globex's key, good from this address before, goes on being served (it was 429 for the window)
    for _ in range(3):
        served = dify.get("/v1/agents", headers=bearer(GLOBEX_WRITER))
        assert served.status_code == 200, served.text
    # And guesses, and a key never served from this address, are still 429 without a lookup
    assert dify.get("/v1/agents", headers=bearer(GUESS + "x")).status_code == 429
    assert dify.get("/v1/agents", headers=bearer(ACME_WRITER)).status_code == 429
    assert keyring.lookups == lookups + 3


def test_requests_without_a_key_and_valid_keys_do_not_count_as_guesses(app: FastAPI) -> None:
    client = client_at(app, "203.0.113.8")
    for _ in range(10):
        assert client.get("/v1/agents").status_code == 401  # no key: a login page, not a guess
        assert client.get("/v1/agents", headers=bearer(ACME_WRITER)).status_code == 200
    assert client.get("/dashboard").status_code == 401
    assert client.get("/v1/agents", headers=bearer(GUESS)).status_code == 401


def test_the_login_form_counts_refused_keys_and_answers_429_as_a_page(app: FastAPI) -> None:
    client = client_at(app, "203.0.113.9")
    for _ in range(3):
        assert client.post("/dashboard/login", data={"key": GUESS}).status_code == 401
    page = client.post("/dashboard/login", data={"key": ACME_WRITER})
    assert page.status_code == 429
    assert "Too many refused keys from this address" in page.text
    assert page.headers["content-type"].startswith("text/html")
    assert int(page.headers["retry-after"]) >= 1


def test_an_address_may_guess_again_once_its_window_ends() -> None:
    guesses = Guesses(2, 0.3)
    guesses.refused("203.0.113.7")
    guesses.refused("203.0.113.7")
    assert 0 < guesses.wait("203.0.113.7") <= 0.3
    time.sleep(0.35)
    assert guesses.wait("203.0.113.7") == 0.0


def test_refusing_more_keys_while_blocked_does_not_lengthen_the_window() -> None:
    guesses = Guesses(1, 0.3)
    guesses.refused("203.0.113.7")
    time.sleep(0.2)
    guesses.refused("203.0.113.7")  # a refused key counted late (a lookup that was under way)
    time.sleep(0.15)
    assert guesses.wait("203.0.113.7") == 0.0


def test_addresses_rotated_by_an_attacker_never_grow_the_count_past_its_bound() -> None:
    guesses = Guesses(1, 60.0, max_addresses=100)
    for n in range(1000):
        guesses.refused(f"10.0.{n // 256}.{n % 256}")
    assert len(guesses) == 100
    assert guesses.wait("10.0.3.231") > 0  # the latest are kept, the oldest dropped
    assert guesses.wait("10.0.0.0") == 0.0


def test_ipv6_addresses_count_per_64_and_ipv4_mapped_ones_as_ipv4() -> None:
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:203.0.113.7") == "203.0.113.7"
    assert source_of(None) == "unknown"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLOWLEDGER_HTTP_AUTH_FAILURES", "0"),
        ("FLOWLEDGER_HTTP_AUTH_FAILURES", "many"),
        ("FLOWLEDGER_HTTP_AUTH_FAILURE_WINDOW_S", "0"),
        ("FLOWLEDGER_HTTP_AUTH_FAILURE_WINDOW_S", "inf"),
    ],
)
def test_the_limit_is_read_from_the_environment_and_a_bad_value_is_refused(variable: str, value: str) -> None:
    assert Settings.from_env({}).http_auth_failures == 20
    assert Settings.from_env({}).http_auth_failure_window_s == 60.0
    read = Settings.from_env(
        {"FLOWLEDGER_HTTP_AUTH_FAILURES": "5", "FLOWLEDGER_HTTP_AUTH_FAILURE_WINDOW_S": "30"}
    )
    assert (read.http_auth_failures, read.http_auth_failure_window_s) == (5, 30.0)
    with pytest.raises(ValidationError, match=variable):
        Settings.from_env({variable: value})


def test_a_setting_of_no_failures_is_refused() -> None:
    with pytest.raises(ValidationError, match="http_auth_failures"):
        Settings(http_auth_failures=0)


def test_the_gate_allows_twenty_refused_keys_a_minute_by_default(simulator: Simulator) -> None:
    engine: Engine = keyed_engine(simulator)
    try:
        gate = create_app(engine, require_keys=True).state.gate
        assert (gate.guesses.failures, gate.guesses.window_s) == (20, 60.0)
    finally:
        engine.close()


class SlowKeyring(CountingKeyring):
    """A keyring whose lookups take 0.2 s, as a busy database's: concurrent guesses overlap."""

    def find(self, token: str) -> ApiKey | None:
        time.sleep(0.2)
        return super().find(token)


def test_concurrent_guesses_get_no_more_lookups_than_the_limit_and_a_burst_of_one_key_takes_one(
    simulator: Simulator,
) -> None:
    # Given a server allowing 5 refused keys per address, whose key lookups are slow
    keyring = SlowKeyring()
    engine = keyed_engine(simulator, http_auth_failures=5)
    try:
        with live_server(create_app(engine, require_keys=True, keys=keyring)) as url:

            async def burst(tokens: list[str]) -> list[int]:
                limits = httpx.Limits(max_connections=len(tokens))
                async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
                    sent = [client.get("/v1/agents", headers=bearer(token)) for token in tokens]
                    return [response.status_code for response in await asyncio.gather(*sent)]

            # When 40 different guesses arrive at once, all before any lookup has ended
            statuses = asyncio.run(burst([f"flk_{n:012d}_" + "g" * 43 for n in range(40)]))
            # Then only 5 were looked up (401); the others were refused before a lookup (429)
            assert keyring.lookups == 5
            assert sorted(statuses) == [401] * 5 + [429] * 35
        keyring.lookups = 0
        engine_of_one_client = keyed_engine(simulator, http_auth_failures=2)
        with live_server(create_app(engine_of_one_client, require_keys=True, keys=keyring)) as url:
            # And a client sending one good key in 30 requests at once is served every one of them
            assert asyncio.run(burst([ACME_WRITER] * 30)) == [200] * 30
        engine_of_one_client.close()
    finally:
        engine.close()
