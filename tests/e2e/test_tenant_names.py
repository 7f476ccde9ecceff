"""One rule for a tenant's name, wherever it is given (``domain.bounds.require_tenant``).

A probe found two: ``keys create --tenant`` took letters, digits, '.', '_' and '-' (at most
100), while the engine (``--tenant`` of ``budgets``, ``retention``, ``dashboard``; and
``FLOWLEDGER_TENANT``) takes any name of at most 200 characters without control characters.
So ``budgets set tenant --tenant "acme corp"`` stored a budget that no API key could ever act
for. Now a key's tenant follows the engine's rule: every tenant with data can have a key.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.keys import PostgresKeyStore, StaticKeys
from tests.conftest import make_settings
from tests.support.cli import run_cli, run_cli_process

SPACED = "acme corp"
TOO_LONG = "t" * 201
TOO_LONG_LINE = "error: tenant: must be at most 200 characters, got 201"
CONTROL_LINE = "error: tenant: must not contain control characters (found U+0009)"
BAD_TENANTS = pytest.mark.parametrize(
    ("tenant", "line"), [(TOO_LONG, TOO_LONG_LINE), ("a\tb", CONTROL_LINE)], ids=["201 characters", "a tab"]
)


@contextmanager
def _environment(changes: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` meanwhile (a subprocess inherits it)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in changes.items():
            patch.setenv(name, value)
        yield


@pytest.fixture
def keys(database_url: str, pg_schema: str) -> Iterator[PostgresKeyStore]:
    store = PostgresKeyStore(database_url, pg_schema)
    yield store
    store.close()


def test_a_key_reaches_a_tenant_whose_name_has_a_space(
    database_url: str, pg_schema: str, keys: PostgresKeyStore
) -> None:
    # Given a budget set from the CLI for tenant "acme corp"
    budget = run_cli(database_url, pg_schema, "budgets", "set", "tenant", "--limit", "5", "--tenant", SPACED)
    assert budget.returncode == 0, budget.stderr

    # When a key is made for that tenant
    made = run_cli(database_url, pg_schema, "keys", "create", "--tenant", SPACED, "--role", "reader")

    # Then it is, and the HTTP API lists the tenant's budget to it
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert [key.tenant for key in keys.list()] == [SPACED]
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        with TestClient(create_app(engine)) as http:
            listed = http.get("/v1/budgets", headers={"Authorization": f"Bearer {token}"})
    finally:
        engine.close()
    assert listed.status_code == 200, listed.text
    assert [(b["scope"], b["subject"]) for b in listed.json()] == [("tenant", SPACED)]


def test_a_key_in_the_environment_may_name_such_a_tenant() -> None:
    settings = Settings.from_env({"FLOWLEDGER_API_KEYS": f"{SPACED}:writer:s3cret-s3cret-s3cret"})
    assert settings.api_keys == ((SPACED, "writer", "s3cret-s3cret-s3cret"),)
    assert [key.tenant for key in StaticKeys(settings.api_keys, salt=b"test salt").list()] == [SPACED]


@pytest.mark.parametrize(
    "args",
    [
        ("keys", "create", "--role", "writer", "--tenant"),
        ("keys", "list", "--tenant"),
        ("budgets", "list", "--tenant"),
        ("budgets", "set", "tenant", "--limit", "5", "--tenant"),
        ("retention", "set", "--workflow", "cs", "--days", "30", "--tenant"),
        ("retention", "list", "--tenant"),
        ("dashboard", "--tenant"),
        ("funnel", "cs", "--tenant"),
        ("projections", "tenant-views"),
    ],
    ids=" ".join,
)
@BAD_TENANTS
def test_every_entry_point_refuses_a_tenant_with_the_same_line(
    database_url: str, pg_schema: str, keys: PostgresKeyStore, args: tuple[str, ...], tenant: str, line: str
) -> None:
    result = run_cli(database_url, pg_schema, *args, tenant)
    assert_refused(result, line)
    assert keys.list(revoked=True) == []  # no key made


@pytest.mark.parametrize("args", [("budgets", "list"), ("retention", "list"), ("dashboard",)])
@BAD_TENANTS
def test_the_tenant_variable_is_refused_with_the_same_line(
    database_url: str, pg_schema: str, args: tuple[str, ...], tenant: str, line: str
) -> None:
    assert_refused(run_cli(database_url, pg_schema, *args, env={"FLOWLEDGER_TENANT": tenant}), line)


@BAD_TENANTS
def test_a_key_in_the_environment_is_refused_with_the_same_line(
    database_url: str, pg_schema: str, tenant: str, line: str
) -> None:
    # `serve` reads FLOWLEDGER_API_KEYS before it starts anything (a process of its own, with
    # a timeout: were the key taken, it would serve)
    with _environment({"FLOWLEDGER_API_KEYS": f"{tenant}:writer:s3cret-s3cret-s3cret"}):
        result = run_cli_process(database_url, pg_schema, "serve", "--port", "0")
    assert_refused(result, line)


def assert_refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    """Exit 2, and ``line`` the only line on stderr."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.splitlines() == [line]


@pytest.mark.parametrize(
    ("written", "tenant"),
    [
        ("acme%3Aeu", "acme:eu"),  # a tenant holding the separators, percent-encoded
        ("north%2Csouth", "north,south"),
        ("50%25", "50%"),
        ("caf%C3%A9", "café"),
        ("100%", "100%"),  # a % not followed by two hex digits stays as written
    ],
)
def test_a_key_in_the_environment_spells_any_tenant_percent_encoded(written: str, tenant: str) -> None:
    settings = Settings.from_env({"FLOWLEDGER_API_KEYS": f"{written}:writer:s3cret:with:colons:and:more"})
    assert settings.api_keys == ((tenant, "writer", "s3cret:with:colons:and:more"),)
    assert [key.tenant for key in StaticKeys(settings.api_keys, salt=b"test salt").list()] == [tenant]


def test_a_tenant_that_is_no_utf8_once_percent_decoded_is_refused() -> None:
    with pytest.raises(ValidationError, match="not UTF-8 once percent-decoded"):
        Settings.from_env({"FLOWLEDGER_API_KEYS": "caf%E9:writer:s3cret-s3cret-s3cret"})
