"""A new tenant's name follows a narrower rule than a stored one (``domain.tenant_names``).

A probe found ``'acme '`` (a trailing space) and a name of one zero-width space taken as
tenants by ``keys create`` and by engines (``--tenant``, ``FLOWLEDGER_TENANT``,
``Engine.for_tenant``). New tenants with such names are now refused; a tenant that already
holds keys or data under such a name keeps reaching them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import ValidationError
from flowledger.domain.tenant_names import require_new_tenant
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine import facade
from flowledger.infrastructure.postgres.keys import PostgresKeyStore
from tests.conftest import make_settings
from tests.support.cli import run_cli

REFUSED = [
    ("acme ", "tenant: a new tenant's name must not start or end with whitespace, got 'acme '"),
    (" acme", "tenant: a new tenant's name must not start or end with whitespace, got ' acme'"),
    ("acme\u00a0", "tenant: a new tenant's name must not start or end with whitespace, got 'acme\\xa0'"),
    (
        "\u200b",
        "tenant: a new tenant's name must hold a visible character, not only ones drawn as nothing,"
        " got '\\u200b'",
    ),
    (
        "ac\u200bme",
        "tenant: a new tenant's name must not contain format characters (found U+200B, drawn as nothing)",
    ),
    (
        "acme\u202e",
        "tenant: a new tenant's name must not contain format characters (found U+202E, drawn as nothing)",
    ),
    # Two spaces in a row read as one ('acme  corp' beside 'acme corp': two tenants), as a new
    # session's id is refused for them (``bounds.require_id``)
    (
        "acme  corp",
        "tenant: a new tenant's name must not hold two spaces in a row: it would read as 'acme corp',"
        " got 'acme  corp'",
    ),
]
CANONICAL = "tenant: a new tenant's name must be in its canonical form (Unicode NFKC, case folded: names that"
LOOKALIKES = [
    ("Acme", f"{CANONICAL} differ only so read alike), got 'Acme': name it 'acme'"),
    ("ACME corp", f"{CANONICAL} differ only so read alike), got 'ACME corp': name it 'acme corp'"),
    (
        "\uff41\uff43\uff4d\uff45",
        f"{CANONICAL} differ only so read alike), got '\\uff41\\uff43\\uff4d\\uff45': name it 'acme'",
    ),
    ("cafe\u0301", f"{CANONICAL} differ only so read alike), got 'cafe\\u0301': name it 'caf\\xe9'"),
    ("\ufb01le", f"{CANONICAL} differ only so read alike), got '\\ufb01le': name it 'file'"),
    ("Ünïcödé", f"{CANONICAL} differ only so read alike), got 'Ünïcödé': name it 'ünïcödé'"),
]
"""Names that read as another tenant's (a probe kept each apart from its canonical twin: two
tenants, two sets of keys and data); refused, saying the canonical form."""
REFUSED += LOOKALIKES
ACCEPTED = ["acme", "acme corp", "café", "ünïcödé-テナント", "a.b_c-d", "strasse"]


@pytest.mark.parametrize(("tenant", "message"), REFUSED, ids=repr)
def test_a_new_tenants_name_outside_the_rule_is_refused_naming_the_rule(tenant: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        require_new_tenant(tenant)
    assert str(refused.value) == message


@pytest.mark.parametrize("tenant", ACCEPTED)
def test_plain_names_may_name_a_new_tenant(tenant: str) -> None:
    assert require_new_tenant(tenant) == tenant


@pytest.fixture
def keys(database_url: str, pg_schema: str) -> Iterator[PostgresKeyStore]:
    store = PostgresKeyStore(database_url, pg_schema)
    yield store
    store.close()


@pytest.mark.parametrize(("tenant", "message"), REFUSED[:1] + REFUSED[3:5] + LOOKALIKES[:4], ids=repr)
def test_no_key_engine_or_tenant_engine_is_made_for_a_new_tenant_so_named(
    database_url: str, pg_schema: str, keys: PostgresKeyStore, tenant: str, message: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema)
    cli = run_cli(database_url, pg_schema, "keys", "create", "--tenant", tenant, "--role", "writer")
    assert (cli.returncode, cli.stderr.splitlines()) == (2, [f"error: {message}"])
    with pytest.raises(ValidationError, match="a new tenant's name"):
        keys.create(tenant, "writer")
    with pytest.raises(ValidationError, match="a new tenant's name"):
        Engine(settings=settings.with_overrides(tenant=tenant))
    with Engine(settings=settings) as engine:
        with pytest.raises(ValidationError, match="a new tenant's name"):
            engine.for_tenant(tenant)
        assert engine.log.head() == 0  # nothing recorded
    budget = run_cli(database_url, pg_schema, "budgets", "set", "tenant", "--limit", "5", "--tenant", tenant)
    assert (budget.returncode, budget.stderr.splitlines()) == (2, [f"error: {message}"])
    assert keys.list(revoked=True) == []


def test_an_in_memory_engine_refuses_such_a_tenant_too() -> None:
    with pytest.raises(ValidationError, match="must not start or end with whitespace"):
        Engine(settings=make_settings(database_url="memory:", tenant="acme "))


def test_a_tenant_whose_data_was_stored_under_such_a_name_still_reads_writes_and_gets_keys(
    database_url: str, pg_schema: str, keys: PostgresKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session and an agent stored under 'acme ' before the rule (no check then)
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(facade, "admit_engine_tenant", lambda url, settings: None)
        with Engine(settings=settings.with_overrides(tenant="acme ")) as old:
            old.start_session("s-1", "cs")
            old.register_agent("a-1", "A", ["python"])

    # When the tenant is named again: an engine, a tenant engine, a key, the CLI
    with Engine(settings=settings.with_overrides(tenant="acme ")) as engine:
        # Then it reads its data and records more
        assert engine.get_session("s-1").workflow == "cs"
        engine.record_step("s-1", "greet")
        assert engine.get_agent("a-1").capacity == 10
    with Engine(settings=settings) as base:
        assert base.for_tenant("acme ").get_session("s-1").version == 2
    issued = keys.create("acme ", "writer")
    assert issued.key.tenant == "acme "
    listed = run_cli(database_url, pg_schema, "agents", "list", "--tenant", "acme ")
    assert listed.returncode == 0, listed.stderr
    assert "a-1" in listed.stdout
    # And the key reaches the data over HTTP
    with Engine(settings=settings) as base, TestClient(create_app(base)) as http:
        read = http.get("/v1/sessions/s-1", headers={"Authorization": f"Bearer {issued.token}"})
    assert read.status_code == 200, read.text


def test_a_tenant_known_only_by_a_retention_policy_still_gets_its_engine(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a retention policy set for ' acme' before the rule, and nothing else of it
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(facade, "admit_engine_tenant", lambda url, settings: None)
        with Engine(settings=settings.with_overrides(tenant=" acme")) as old:
            old.retention.set_policy("cs", 30)
    # When its engine is started again, Then it is, and reads the policy
    with Engine(settings=settings.with_overrides(tenant=" acme")) as engine:
        assert engine.retention.policies() == {"cs": 30}


def test_a_tenant_that_holds_only_a_key_made_before_the_rule_gets_another(
    database_url: str, pg_schema: str, keys: PostgresKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a key for '\u200b' made before the rule, since revoked (key rotation)
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr("flowledger.infrastructure.postgres.keys.admit_tenant", lambda *args: None)
        old = keys.create("\u200b", "reader")
    assert keys.revoke(old.key.key_id)
    # When another is made, Then it is, and its engine starts
    assert keys.create("\u200b", "reader").key.tenant == "\u200b"
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as base:
        assert base.for_tenant("\u200b").list_agents() == []


def test_a_request_with_an_environment_key_for_a_new_tenant_so_named_is_a_4xx(
    database_url: str, pg_schema: str
) -> None:
    secret = "s3cret-s3cret-s3cret"
    settings = make_settings(
        database_url=database_url, schema=pg_schema, api_keys=(("acme ", "writer", secret),)
    )
    with Engine(settings=settings) as base, TestClient(create_app(base)) as http:
        answer = http.post(
            "/v1/sessions",
            json={"session_id": "s", "workflow": "cs"},
            headers={"Authorization": f"Bearer {secret}"},
        )
        head = base.log.head()
    assert answer.status_code == 422, answer.text
    assert "a new tenant's name must not start or end with whitespace" in answer.json()["error"]
    assert head == 0


def test_a_lookalike_of_a_tenant_is_refused_rather_than_kept_apart_or_folded_into_it(
    database_url: str, pg_schema: str, keys: PostgresKeyStore
) -> None:
    # Given a tenant 'acme' with a session
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings.with_overrides(tenant="acme")) as acme:
        acme.start_session("s-1", "cs")
    # When a key is asked for 'Acme' (a tenant that holds nothing)
    with pytest.raises(ValidationError) as refused:
        keys.create("Acme", "reader")
    # Then it is refused naming the canonical form: no second tenant, and no key to 'acme' either
    assert str(refused.value).endswith("got 'Acme': name it 'acme'")
    assert keys.list(revoked=True) == []


def test_a_tenant_stored_under_a_name_not_in_canonical_form_before_the_rule_still_gets_keys(
    database_url: str, pg_schema: str, keys: PostgresKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session stored under 'Acme' before the rule (no check then)
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(facade, "admit_engine_tenant", lambda url, settings: None)
        with Engine(settings=settings.with_overrides(tenant="Acme")) as old:
            old.start_session("s-1", "cs")
    # When its engine and a key are made again, Then they are, and reach its data
    with Engine(settings=settings.with_overrides(tenant="Acme")) as engine:
        assert engine.get_session("s-1").workflow == "cs"
    assert keys.create("Acme", "writer").key.tenant == "Acme"
