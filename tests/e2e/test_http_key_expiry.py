"""Keys that expire: made with ``keys create --expires-in``, listed with their expiry, refused
with a 401 that says so once past it (the server's 5 s cache of good keys included), and a
table made before keys could expire upgraded in place, its keys never expiring."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from flowledger.adapters.cli.main import app as cli
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import Keyring
from flowledger.domain.errors import SessionNotFound
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.keys import PostgresKeyStore, StaticKeys, digest
from tests.conftest import make_settings
from tests.e2e.live_http import bearer, live_server
from tests.support.cli import run_cli


@pytest.fixture
def store(database_url: str, pg_schema: str) -> Iterator[PostgresKeyStore]:
    keys = PostgresKeyStore(database_url, pg_schema)
    yield keys
    keys.close()


@pytest.fixture
def cli_env(database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("FLOWLEDGER_DATABASE_URL", database_url)
    monkeypatch.setenv("FLOWLEDGER_SCHEMA", pg_schema)
    return CliRunner()


def test_a_key_made_with_expires_in_carries_its_expiry_and_the_list_shows_it(
    cli_env: CliRunner, store: PostgresKeyStore, database_url: str, pg_schema: str
) -> None:
    # When one key is made to last 30 days and another without an expiry
    before = datetime.now(UTC)
    made = cli_env.invoke(
        cli, ["keys", "create", "--tenant", "acme", "--role", "reader", "--expires-in", "30d"]
    )
    assert made.exit_code == 0, made.output
    assert cli_env.invoke(cli, ["keys", "create", "--tenant", "acme", "--role", "writer"]).exit_code == 0
    # Then the first expires 30 days after it was made, the second never
    expiring, lasting = sorted(store.list(), key=lambda key: key.expires_at is None)
    assert expiring.expires_at is not None
    assert expiring.created_at is not None
    assert expiring.expires_at - expiring.created_at == timedelta(days=30)
    assert before + timedelta(days=30) - timedelta(seconds=5) < expiring.expires_at
    assert lasting.expires_at is None
    # And the note on stderr and the list both say when
    shown = f"{expiring.expires_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    assert shown in made.stderr
    # (run as a user would, 200 columns wide: CliRunner's COLUMNS reached no console made before)
    listed = run_cli(database_url, pg_schema, "keys", "list")
    assert "expires" in listed.stdout
    assert shown in listed.stdout
    assert "never" in listed.stdout


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("0d", "is an empty window"),
        ("30", "is not a duration like 30m, 24h or 7d"),
        ("-5d", "is not a duration like 30m, 24h or 7d"),
        ("", "is not a duration like 30m, 24h or 7d"),
        ("2026-12-31T00:00:00Z", "is not a duration like 30m, 24h or 7d"),
        ("3661d", "must be above zero and at most 3660 days"),
        ("100000d", "has more than 5 digits"),
    ],
)
def test_a_bad_expires_in_is_one_line_and_exit_2_and_makes_no_key(
    cli_env: CliRunner, store: PostgresKeyStore, given: str, words: str
) -> None:
    result = cli_env.invoke(
        cli, ["keys", "create", "--tenant", "acme", "--role", "reader", "--expires-in", given]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: --expires-in: "), result.stderr
    assert words in result.stderr
    assert result.stdout == ""
    assert store.list(revoked=True) == []


def test_an_expired_key_is_refused_with_401_saying_so_right_after_it_was_admitted(
    database_url: str, pg_schema: str, store: PostgresKeyStore
) -> None:
    # Given a server of a tenant, and a key of it that expires in four seconds (made once the
    # server is up: on a loaded machine the engine's and server's start took longer than two,
    # and so, once, did the key's first request)
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, tenant="acme"))
    keyring = Keyring.of(engine)
    try:
        with live_server(create_app(engine, keys=keyring)) as url, httpx.Client(base_url=url) as client:
            issued = store.create("acme", "writer", expires_in=timedelta(seconds=4))
            assert issued.key.expires_at is not None
            # When it is used before its expiry, it works
            assert client.get("/v1/agents", headers=bearer(issued.token)).status_code == 200
            # And after its expiry, within 5 s of that (as long as a cache of good keys once held it)
            time.sleep(max(0.0, (issued.key.expires_at - datetime.now(UTC)).total_seconds()) + 0.2)
            read = client.get("/v1/agents", headers=bearer(issued.token))
            write = client.post(
                "/v1/sessions", json={"session_id": "s1", "workflow": "cs"}, headers=bearer(issued.token)
            )
            # Then both are 401, saying the key expired, and nothing is written
            for refused in (read, write):
                assert refused.status_code == 401, refused.text
                assert refused.json() == {
                    "success": False,
                    "error": "this API key has expired: ask for a new one",
                }
                assert refused.headers["www-authenticate"] == "Bearer"
            with pytest.raises(SessionNotFound):
                engine.history("s1")
            # And a wrong secret under the same key id is still only "unknown"
            forged = issued.token[:-4] + ("aaaa" if not issued.token.endswith("aaaa") else "bbbb")
            unknown = client.get("/v1/agents", headers=bearer(forged))
            assert unknown.json()["error"] == "this API key is unknown or revoked"
            # And an expired key still counts as configured: a restarted server stays closed
            assert store.has_keys()
            # And the dashboard's login form says it expired too
            login = client.post("/dashboard/login", data={"key": issued.token})
            assert login.status_code == 401
            assert "That key has expired." in login.text
    finally:
        engine.close()


_OLD_TABLE = """
CREATE TABLE {table} (
    key_id text PRIMARY KEY,
    tenant text NOT NULL,
    role text NOT NULL CHECK (role IN ('reader', 'writer', 'admin')),
    token_sha256 bytea NOT NULL,
    label text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
)
"""


def test_a_table_made_before_keys_could_expire_is_upgraded_and_its_keys_never_expire(
    database_url: str, pg_schema: str
) -> None:
    # Given the table as an older version made it, holding one key
    token = "flk_abcdefghijkl_" + "x" * 43
    table = sql.Identifier(pg_schema, "api_keys")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(pg_schema)))
        conn.execute(sql.SQL(_OLD_TABLE).format(table=table))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (key_id, tenant, role, token_sha256) VALUES (%s, 'acme', 'reader', %s)"
            ).format(table),
            ["abcdefghijkl", digest(token)],
        )
    # When this version finds the key and makes one that expires
    store = PostgresKeyStore(database_url, pg_schema)
    try:
        old = store.find(token)
        new = store.create("acme", "reader", expires_in=timedelta(hours=1))
        # Then the old key reads as never expiring, and the new one keeps its expiry
        assert old is not None
        assert old.expires_at is None
        assert {key.key_id: key.expires_at is None for key in store.list()} == {
            "abcdefghijkl": True,
            new.key.key_id: False,
        }
    finally:
        store.close()


def test_a_revoked_or_expired_key_still_in_use_does_not_lock_the_other_keys_of_its_address_out(
    database_url: str, pg_schema: str, store: PostgresKeyStore
) -> None:
    # Given a client (a Dify server, say) holding three keys of one server: one revoked, one
    # expired, one good, and a server that allows 3 refused keys per address
    revoked = store.create("acme", "writer")
    expired = store.create("acme", "writer", expires_in=timedelta(milliseconds=1))
    good = store.create("acme", "writer")
    assert store.revoke(revoked.key.key_id)
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme", http_auth_failures=3)
    engine = Engine(settings=settings)
    try:
        with live_server(create_app(engine)) as url, httpx.Client(base_url=url) as client:
            # When the stale keys go on being sent, well past the limit
            for _ in range(5):
                assert client.get("/v1/agents", headers=bearer(revoked.token)).status_code == 401
                assert client.get("/v1/agents", headers=bearer(expired.token)).status_code == 401
            # Then they are refused as what they are, not as guesses, and the good key still works:
            # their holder has a real token, and a revoked or expired one costs no more lookups than
            # a good one (the server caches the row it found)
            assert client.get("/v1/agents", headers=bearer(revoked.token)).json()["error"] == (
                "this API key is unknown or revoked"
            )
            assert client.get("/v1/agents", headers=bearer(good.token)).status_code == 200
            # And a guess from that address is still counted: three are looked up, the fourth is 429
            guess = "flk_abcdefghijkl_" + "g" * 43
            assert [client.get("/v1/agents", headers=bearer(guess)).status_code for _ in range(4)] == [
                401,
                401,
                401,
                429,
            ]
    finally:
        engine.close()


def test_revoking_a_key_of_the_environment_says_where_it_comes_from(
    cli_env: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a key given in FLOWLEDGER_API_KEYS, whose id the access log and the events show
    monkeypatch.setenv("FLOWLEDGER_API_KEYS", "acme:writer:env-secret-0123456789abcdef")
    settings = Settings.from_env()
    keys = PostgresKeyStore(settings.database_url or "", settings.schema, settings)
    try:
        key_id = StaticKeys(settings.api_keys, salt=keys.id_salt()).list()[0].key_id
    finally:
        keys.close()
    # When it is revoked
    result = cli_env.invoke(cli, ["keys", "revoke", key_id])
    # Then the command says it is the environment's, which only removing it there revokes
    # (it said "no active key", of a key every server accepts)
    assert result.exit_code == 3, result.output
    assert result.stderr.strip() == (
        f"error: key {key_id!r} is given in FLOWLEDGER_API_KEYS, not stored: remove it there and"
        " restart the servers that read it"
    )


@pytest.mark.parametrize(
    ("expires_at", "revoked_at", "status"),
    [
        ("infinity", None, 200),  # PostgreSQL's "never": the key works
        ("20000-01-01 00:00+00", None, 200),  # past year 9999: as good as never
        ("-infinity", None, 401),  # expired for ever
        ("0044-03-15 00:00+00 BC", None, 401),
        (None, "infinity", 401),  # revoked, whenever that was written
        (None, "-infinity", 401),
    ],
)
def test_a_key_whose_times_were_set_to_infinity_in_the_database_is_judged_not_a_500(
    database_url: str,
    pg_schema: str,
    store: PostgresKeyStore,
    expires_at: str | None,
    revoked_at: str | None,
    status: int,
) -> None:
    # Given a key whose expiry or revocation an operator set by hand to a time Python holds no
    # datetime for ('infinity' is PostgreSQL's way to write "never"): every request with it was
    # a 500 ("timestamp too large (after year 10K): 'infinity'"), and `keys list` failed alike
    issued = store.create("acme", "writer")
    store.create("acme", "reader")  # a key in use: the server is not open
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET expires_at = %s::timestamptz, revoked_at = %s::timestamptz WHERE key_id = %s"
            ).format(sql.Identifier(pg_schema, "api_keys")),
            [expires_at, revoked_at, issued.key.key_id],
        )
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, tenant="acme"))
    try:
        with live_server(create_app(engine)) as url, httpx.Client(base_url=url) as client:
            # When it is used
            answer = client.get("/v1/agents", headers=bearer(issued.token))
        # Then it is taken, or refused as expired or revoked: never a 500
        assert answer.status_code == status, answer.text
        if status == 401:
            assert answer.json()["error"] in (
                "this API key has expired: ask for a new one",
                "this API key is unknown or revoked",
            )
        # And the keys read back: never expiring past year 9999, expired before year 1, revoked
        (listed,) = [key for key in store.list(revoked=True) if key.key_id == issued.key.key_id]
        assert (listed.expires_at is None) == (expires_at is None or status == 200)
        assert (listed.revoked_at is None) == (revoked_at is None)
    finally:
        engine.close()


def test_a_key_is_judged_expired_by_the_engines_clock_the_one_it_was_made_by(
    database_url: str, pg_schema: str, store: PostgresKeyStore
) -> None:
    # Given a key made to expire in an hour by the database's clock, and a server whose engine
    # reads that clock two hours on (as a host would whose own clock is two hours behind)
    later = lambda: datetime.now(UTC) + timedelta(hours=2)  # noqa: E731
    engine = Engine(
        settings=make_settings(database_url=database_url, schema=pg_schema, tenant="acme"), clock=later
    )
    try:
        with (
            live_server(create_app(engine, keys=Keyring.of(engine))) as url,
            httpx.Client(base_url=url) as client,
        ):
            issued = store.create("acme", "writer", expires_in=timedelta(hours=1))
            # When it is used, then it is refused as expired (the host's clock had said it was good)
            refused = client.get("/v1/agents", headers=bearer(issued.token))
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"] == "this API key has expired: ask for a new one"
    finally:
        engine.close()
