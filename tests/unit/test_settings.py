"""Settings come from FLOWLEDGER_* variables once, and are checked when built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from flowledger.domain import ValidationError
from flowledger.infrastructure import Settings
from flowledger.infrastructure.postgres.database import library_env
from flowledger.infrastructure.settings import MAX_SCHEMA_LENGTH
from flowledger.infrastructure.variables import INTERNAL, LEFT_ALONE, READ, refuse_misspelt_variables
from flowledger.projections import all_projections
from flowledger.projections.catalog import Names


def test_settings_read_the_flowledger_variables() -> None:
    settings = Settings.from_env(
        {
            "FLOWLEDGER_DATABASE_URL": "postgresql://app:secret@db.internal:6543/flows",
            "FLOWLEDGER_HOME": "/srv/flowledger",
            "FLOWLEDGER_LLM_BASE_URL": "http://127.0.0.1:9000/v1",
            "FLOWLEDGER_PRICING_FILE": "/etc/prices.json",
        }
    )
    assert settings.database_url == "postgresql://app:secret@db.internal:6543/flows"
    assert settings.home == Path("/srv/flowledger")
    assert settings.llm_base_url == "http://127.0.0.1:9000/v1"
    assert settings.pricing_file == Path("/etc/prices.json")


@pytest.mark.parametrize("value", ["maybe", "2", "ture", "enabled"])
def test_group_commit_set_to_neither_on_nor_off_is_refused(value: str) -> None:
    # Any value but an "off" word turned it on: FLOWLEDGER_GROUP_COMMIT=maybe (or a typo of
    # "true") ran every save through the opt-in group commit without a word.
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({"FLOWLEDGER_GROUP_COMMIT": value})
    assert raised.value.field == "FLOWLEDGER_GROUP_COMMIT"
    assert (
        str(raised.value)
        == f"FLOWLEDGER_GROUP_COMMIT: must be on or off (1/true/yes/on, 0/false/no/off), got {value!r}"
    )


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("Yes", True), ("on", True), ("0", False), ("off", False), ("", False)]
)
def test_group_commit_reads_the_usual_words(value: str, on: bool) -> None:
    assert Settings.from_env({"FLOWLEDGER_GROUP_COMMIT": value}).group_commit is on


# Every on/off setting reads the same words; each was loose in its own way: the opt-ins took
# anything but an on word as off (FLOWLEDGER_SEAL_PERSONAL_DATA=enabled left personal data in
# the clear without a word), the two on by default anything but an off word as on.
SWITCHES = {
    "FLOWLEDGER_PGBOUNCER": ("pgbouncer", False),
    "FLOWLEDGER_DASHBOARD_URL_KEYS": ("dashboard_url_keys", False),
    "FLOWLEDGER_WEBHOOK_STRICT": ("webhook_strict", False),
    "FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE": ("webhook_allow_private", False),
    "FLOWLEDGER_SEAL_PERSONAL_DATA": ("seal_personal_data", False),
    "FLOWLEDGER_AGENT_LOCKS": ("agent_locks", True),
    "FLOWLEDGER_AUDIT_CHAIN": ("audit_chain", True),
    "FLOWLEDGER_GROUP_COMMIT": ("group_commit", False),
}


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("value", ["maybe", "enabled", "2", "ture"])
def test_every_switch_refuses_a_word_that_is_neither_on_nor_off(name: str, value: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({name: value})
    assert str(raised.value) == f"{name}: must be on or off (1/true/yes/on, 0/false/no/off), got {value!r}"


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_every_switch_reads_the_usual_words_and_keeps_its_default_when_unset(name: str) -> None:
    field, default = SWITCHES[name]
    assert getattr(Settings.from_env({}), field) is default
    assert getattr(Settings.from_env({name: ""}), field) is default
    assert getattr(Settings.from_env({name: " Yes "}), field) is True
    assert getattr(Settings.from_env({name: "OFF"}), field) is False


def test_group_commit_is_off_unless_asked_for() -> None:
    assert Settings.from_env({}).group_commit is False
    on = Settings.from_env({"FLOWLEDGER_GROUP_COMMIT": "1", "FLOWLEDGER_GROUP_COMMIT_LEADERS": "3"})
    assert (on.group_commit, on.group_commit_leaders) == (True, 3)


def test_the_pool_size_comes_from_the_environment_and_must_be_positive() -> None:
    # An operator sizes pools so that processes x tenants x pool fit the server's max_connections.
    assert Settings.from_env({}).pool_size == 20
    assert Settings.from_env({"FLOWLEDGER_POOL_SIZE": "8"}).pool_size == 8
    for raw in ("0", "-3", "many"):
        with pytest.raises(ValidationError) as refused:
            Settings.from_env({"FLOWLEDGER_POOL_SIZE": raw})
        assert refused.value.field == "FLOWLEDGER_POOL_SIZE"
    with pytest.raises(ValidationError) as refused:
        Settings(pool_size=0)
    assert refused.value.field == "pool_size"


def test_a_libpq_url_becomes_the_event_library_settings() -> None:
    env = library_env("postgresql://app:secret@db.internal:6543/flows", schema="fl", pool_size=5)
    assert env["POSTGRES_HOST"] == "db.internal"
    assert env["POSTGRES_PORT"] == "6543"
    assert env["POSTGRES_USER"] == "app"
    assert env["POSTGRES_PASSWORD"] == "secret"
    assert env["POSTGRES_DBNAME"] == "flows"
    assert env["POSTGRES_SCHEMA"] == "fl"


def test_a_unix_socket_url_keeps_its_socket_directory() -> None:
    env = library_env("postgresql://postgres:@/postgres?host=/tmp/pg", schema="fl", pool_size=5)
    assert env["POSTGRES_HOST"] == "/tmp/pg"


@pytest.mark.parametrize("schema", ["Robert'); DROP", "1abc", "with space", ""])
def test_a_schema_name_that_is_not_a_plain_sql_name_is_rejected(schema: str) -> None:
    with pytest.raises(ValidationError, match=r"schema: .* is not a plain lower-case SQL name"):
        Settings(schema=schema)


def test_the_read_database_url_is_read_from_the_environment_and_checked() -> None:
    replica = "postgresql://reader@127.0.0.1:5433/flows"
    assert Settings.from_env({"FLOWLEDGER_READ_DATABASE_URL": replica}).read_database_url == replica
    assert Settings.from_env({}).read_database_url is None
    with pytest.raises(ValidationError, match="FLOWLEDGER_READ_DATABASE_URL") as refused:
        Settings.from_env({"FLOWLEDGER_READ_DATABASE_URL": "replica:s3cret"})
    assert "s3cret" not in str(refused.value)


def test_the_event_log_partitions_come_from_the_environment_and_bad_counts_are_refused() -> None:
    assert Settings.from_env({}).event_partitions is None
    assert Settings.from_env({"FLOWLEDGER_EVENT_PARTITIONS": "0"}).event_partitions == 0
    assert Settings.from_env({"FLOWLEDGER_EVENT_PARTITIONS": "8"}).event_partitions == 8
    for bad in ("-1", "eight", "1.5"):
        with pytest.raises(ValidationError, match="FLOWLEDGER_EVENT_PARTITIONS"):
            Settings.from_env({"FLOWLEDGER_EVENT_PARTITIONS": bad})
    with pytest.raises(ValidationError, match="event_partitions"):
        Settings(event_partitions=1025)


def test_the_library_env_keeps_the_urls_other_parameters_for_the_pool() -> None:
    url = "postgresql://app:pw@db1:5432,db2:5432/flows?target_session_attrs=read-write&sslmode=require"
    env = library_env(url, schema="s", pool_size=4)
    assert (env["POSTGRES_HOST"], env["POSTGRES_PORT"]) == ("db1,db2", "5432,5432")
    assert conninfo_to_dict(env["FLOWLEDGER_LIBPQ_PARAMS"]) == {
        "target_session_attrs": "read-write",
        "sslmode": "require",
    }


def test_the_step_lease_comes_from_the_environment_and_must_be_positive() -> None:
    # A server's lease is set where it is started (``serve`` has no other way to set it)
    assert Settings.from_env({}).step_lease_s == 15.0
    assert Settings.from_env({"FLOWLEDGER_STEP_LEASE_S": "4.5"}).step_lease_s == 4.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValidationError, match="FLOWLEDGER_STEP_LEASE_S"):
            Settings.from_env({"FLOWLEDGER_STEP_LEASE_S": bad})


def test_the_classify_lock_wait_comes_from_the_environment_and_must_be_positive() -> None:
    # How long a classify waits for another server's classification of the task is set where
    # the server is started
    assert Settings.from_env({}).classify_lock_wait_s == 60.0
    assert Settings.from_env({"FLOWLEDGER_CLASSIFY_LOCK_WAIT_S": "2.5"}).classify_lock_wait_s == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(ValidationError, match="FLOWLEDGER_CLASSIFY_LOCK_WAIT_S"):
            Settings.from_env({"FLOWLEDGER_CLASSIFY_LOCK_WAIT_S": bad})
    with pytest.raises(ValidationError, match="classify_lock_wait_s"):
        Settings(classify_lock_wait_s=0)


@pytest.mark.parametrize(
    "name", ["FLOWLEDGER_OPERATION_DEADLINE_S", "FLOWLEDGER_CLASSIFY_LOCK_WAIT_S", "FLOWLEDGER_STEP_LEASE_S"]
)
def test_a_wait_without_end_is_refused(name: str) -> None:
    # "inf" parses as a float: a deadline or a wait that never ends, taken without a word
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({name: "inf"})
    assert str(refused.value) == f"{name}: must be a finite number of seconds, got 'inf'"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"schema": 5}, "schema"),
        ({"database_url": 5}, "database_url"),
        ({"database_url": "not a url"}, "database_url"),
        ({"database_url": "http://db:5432"}, "database_url"),
        ({"pool_size": "x"}, "pool_size"),
        ({"pool_size": 2.5}, "pool_size"),
        ({"max_conflict_retries": True}, "max_conflict_retries"),
        ({"write_cache_size": -1}, "write_cache_size"),
        ({"write_cache_bytes": -1}, "write_cache_bytes"),
        ({"operation_deadline_s": float("nan")}, "operation_deadline_s"),
        ({"operation_deadline_s": -1}, "operation_deadline_s"),
        ({"operation_deadline_s": float("inf")}, "operation_deadline_s"),
        ({"statement_timeout_s": 0}, "statement_timeout_s"),
        ({"connect_timeout_s": "3"}, "connect_timeout_s"),
        ({"pool_timeout_s": -0.5}, "pool_timeout_s"),
        ({"step_lease_s": float("nan")}, "step_lease_s"),
    ],
    ids=repr,
)
def test_settings_given_as_arguments_are_checked_as_the_environment_is(
    overrides: dict[str, object], field: str
) -> None:
    # (An embedding probe: Engine(schema=5) raised TypeError from the regex, database_url=5
    # AttributeError, "not a url" psycopg's ProgrammingError, pool_size="x" TypeError, and a
    # NaN or negative operation deadline was taken as it was.)
    with pytest.raises(ValidationError) as raised:
        Settings(database_url="memory:").with_overrides(**overrides)
    assert raised.value.field == field


def test_a_memory_url_or_a_libpq_string_is_a_database_url() -> None:
    Settings(database_url="memory:")
    Settings(database_url="postgresql://app@db:5432/flows")
    Settings(database_url="host=db dbname=flows user=app")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("garbage", "is not a PostgreSQL connection string"),
        ("mysql://x@127.0.0.1/test", "is not a PostgreSQL connection string"),
        ("postgresql://u@127.0.0.1:99999/db", "port '99999' is not a port number (1 to 65535)"),
        ("postgresql://u:s3cret@127.0.0.1:0/db", "port '0' is not a port number (1 to 65535)"),
    ],
)
def test_a_database_url_that_cannot_name_a_server_is_refused_at_once(url: str, why: str) -> None:
    # It was tried as an outage for the whole deadline ("invalid port number", exit 75 after
    # 16 s) or reached the user as psycopg's 'missing "=" after "garbage"', exit 1
    with pytest.raises(ValidationError, match="FLOWLEDGER_DATABASE_URL") as refused:
        Settings.from_env({"FLOWLEDGER_DATABASE_URL": url})
    assert why in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_usual_database_urls_and_the_memory_store_are_accepted() -> None:
    for url in (
        "postgresql://u@127.0.0.1:5432/db",
        "postgres://u@h1:5432,h2:5433/db",
        "host=127.0.0.1 port=5432 dbname=db",
        "postgresql:///db?host=/var/run/postgresql",
        "memory:",
    ):
        assert Settings(database_url=url).database_url == url


@pytest.mark.parametrize(
    ("misspelt", "meant"),
    [
        ("FLOWLEDGER_DATABSE_URL", "FLOWLEDGER_DATABASE_URL"),
        ("FLOWLEDGER_POOL_SIZ", "FLOWLEDGER_POOL_SIZE"),
        ("FLOWLEDGER_OPERATION_DEADLINE", "FLOWLEDGER_OPERATION_DEADLINE_S"),
        ("FLOWLEDGER_LLM_BASEURL", "FLOWLEDGER_LLM_BASE_URL"),
        ("FLOWLEDGER_SEAL_PERSONAL_DATE", "FLOWLEDGER_SEAL_PERSONAL_DATA"),
    ],
)
def test_a_misspelt_variable_is_refused_naming_the_one_it_resembles(misspelt: str, meant: str) -> None:
    # (A misspelt FLOWLEDGER_DATABASE_URL was passed over in silence: the engine then started
    # an embedded PostgreSQL under FLOWLEDGER_HOME and wrote there instead.)
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({misspelt: "1"})
    assert raised.value.field == misspelt
    assert meant in raised.value.message


def _configuration_table() -> set[str]:
    """The variables named in the first column of the README's configuration table."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    configuration = readme[readme.index("## Configuration") : readme.index("## Benchmarks")]
    rows = [line for line in configuration.splitlines() if line.startswith("| `FLOWLEDGER_")]
    return {name for row in rows for name in re.findall(r"`(FLOWLEDGER_[A-Z0-9_]+)`", row.split("|")[1])}


def test_every_documented_variable_and_other_names_under_the_prefix_are_let_through() -> None:
    # Given every variable the README's configuration table names, with the test suite's own
    # and a name of the embedding service's that resembles none of flowledger's
    documented = _configuration_table()
    assert "FLOWLEDGER_DATABASE_URL" in documented
    others = {"FLOWLEDGER_TEST_DATABASE_URL", "FLOWLEDGER_TEST_RUN_ID", "FLOWLEDGER_MY_SERVICE_REGION"}
    # Then each is read or left alone, none refused as a misspelling
    for name in documented | others:
        refuse_misspelt_variables({name: "x"})


def test_every_variable_the_source_reads_is_known_as_read() -> None:
    # (A variable added to the code but not to the list would be refused as a typo of another.)
    root = Path(__file__).resolve().parents[2]
    named: set[str] = set()
    for folder in ("domain", "infrastructure", "projections", "adapters", "verify"):
        for source in (root / folder).rglob("*.py"):
            text = source.read_text(encoding="utf-8")
            named |= set(re.findall(r"\b(FLOWLEDGER_[A-Z0-9_]*[A-Z0-9])\b", text))
    assert named - READ - LEFT_ALONE == set()


@pytest.mark.parametrize(
    "given",
    [
        "acme:reader:same-secret-0123456789,acme:admin:same-secret-0123456789",
        "acme:reader:same-secret-0123456789,globex:reader:same-secret-0123456789",
        "acme:reader:same-secret-0123456789,acme:reader:same-secret-0123456789",
    ],
    ids=["two-roles", "two-tenants", "twice-the-same"],
)
def test_one_secret_given_twice_in_the_environment_is_refused_without_quoting_it(given: str) -> None:
    # One secret listed as a reader's and an admin's acted as the admin (the last one listed)
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({"FLOWLEDGER_API_KEYS": given})
    assert str(refused.value).startswith("FLOWLEDGER_API_KEYS: keys 1 and 2 have the same secret")
    assert "same-secret" not in str(refused.value)
    with pytest.raises(ValidationError, match="api_keys: keys 1 and 2 have the same secret"):
        Settings(api_keys=(("acme", "reader", "s" * 20), ("acme", "admin", "s" * 20)))


@pytest.mark.parametrize(
    "given",
    [
        "acme:writer: secret-0123456789abcdef",
        "acme:writer:\tsecret-0123456789abcdef,acme:reader:other-0123456789",
    ],
    ids=["space-after-the-colon", "tab-after-the-colon"],
)
def test_a_secret_with_white_space_at_an_end_is_refused_since_no_request_can_carry_it(given: str) -> None:
    # "acme:writer: secret" was read as the secret " secret", and a request's key never holds
    # the spaces around it (HTTP drops them): the key could never be used, and nothing said so
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({"FLOWLEDGER_API_KEYS": given})
    assert str(refused.value) == (
        "FLOWLEDGER_API_KEYS: the secret of key 1 begins or ends with white space, which no request"
        " can carry (HTTP drops it): remove it"
    )


def test_a_short_secret_in_the_environment_is_refused_without_quoting_it() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({"FLOWLEDGER_API_KEYS": "acme:writer:0123456789abcdef,acme:reader:x"})
    assert "the secret of key 2 has 1 characters; give at least 16" in str(refused.value)
    assert ":x" not in str(refused.value)


def test_the_readmes_configuration_table_names_every_variable_a_user_may_set_and_no_other() -> None:
    # (FLOWLEDGER_ROUTING_FILE, FLOWLEDGER_SKILL_CATALOGUE_FILE and FLOWLEDGER_LLM_MAX_REPLY_BYTES
    # were read but missing from the table a newcomer looks them up in.)
    # Given the variables of the README's table, and those flowledger reads
    documented = _configuration_table()
    # Then the table has a row for each one a user sets, and none that nothing reads
    assert documented == READ - INTERNAL


DEFAULT_CONFLICT_BOUND = 256
"""64 ended calls of 64 engines writing one session at once (1-5 of 640 met ConcurrentUpdate,
each with 65 clashes in a row); 256 ended none of 1,920, nor of 576 from 96 engines."""


def test_the_default_conflict_bound_outlasts_sixty_four_writers_of_one_session() -> None:
    # Losing every race at the backoff's cap (100 ms at most, 50 ms on average), a writer
    # with the default bound tries for about as long as its operation's deadline allows.
    settings = Settings.from_env({})
    assert settings.max_conflict_retries == DEFAULT_CONFLICT_BOUND
    assert settings.max_conflict_retries * 0.05 >= 0.8 * settings.operation_deadline_s


def test_the_conflict_bound_is_set_from_the_environment() -> None:
    # The bound ConcurrentUpdate names could only be set in code: ``serve`` kept 64.
    assert Settings.from_env({}).max_conflict_retries == DEFAULT_CONFLICT_BOUND
    assert Settings.from_env({"FLOWLEDGER_MAX_CONFLICT_RETRIES": "200"}).max_conflict_retries == 200
    assert Settings.from_env({"FLOWLEDGER_MAX_CONFLICT_RETRIES": "0"}).max_conflict_retries == 0
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({"FLOWLEDGER_MAX_CONFLICT_RETRIES": "-1"})
    assert refused.value.field == "FLOWLEDGER_MAX_CONFLICT_RETRIES"


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FLOWLEDGER_POOL_SIZE", "\u00b2"),  # a superscript two: isdigit() said yes, int() raised ValueError
        ("FLOWLEDGER_POOL_SIZE", "\u0665"),  # an Arabic-Indic five: read as 5
        ("FLOWLEDGER_HTTP_MAX_TENANT_ENGINES", "\uff15"),
        ("FLOWLEDGER_STEP_LEASE_S", "1_0"),  # float() read 10
        ("FLOWLEDGER_STEP_LEASE_S", "\u0665"),
        ("FLOWLEDGER_DATABASE_URL", "postgresql://h:\u00b2/d"),
    ],
)
def test_a_number_in_the_environment_not_written_in_ascii_digits_is_refused_by_name(
    name: str, raw: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({name: raw})
    assert name in str(refused.value)


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "pg_toast", "pg_flowledger"])
def test_a_system_schema_is_refused_since_its_tables_would_be_left_out_of_every_dump(schema: str) -> None:
    # (An outside probe: FLOWLEDGER_SCHEMA=information_schema made the whole log there, which
    # pg_dump never dumps; pg_flowledger stopped `flowledger migrate` with the server's words, exit 1.)
    with pytest.raises(ValidationError, match=r"schema: .* is PostgreSQL's own .* choose another name"):
        Settings(schema=schema)
    with pytest.raises(ValidationError, match=r"is PostgreSQL's own"):
        Settings.from_env({"FLOWLEDGER_SCHEMA": schema})


@pytest.mark.parametrize("name", ["statement_timeout_s", "ready_timeout_s", "operation_deadline_s"])
@pytest.mark.parametrize("seconds", ["0.0001", "3000000", "1e9"])
def test_a_server_timeout_the_server_cannot_count_in_milliseconds_is_refused(name: str, seconds: str) -> None:
    # (An outside probe: FLOWLEDGER_STATEMENT_TIMEOUT_S=3000000 stopped `flowledger migrate` with
    # the server's 'invalid value for parameter "statement_timeout": "3000000000" HINT: Value
    # exceeds integer range.', exit 1; 0.0001 became statement_timeout = 0, which is no timeout;
    # FLOWLEDGER_OPERATION_DEADLINE_S=3000000, every connection's tcp_user_timeout, made libpq
    # refuse each connection, tried again as an outage: `flowledger history s` hung.)
    variable = f"FLOWLEDGER_{name.upper()}"
    with pytest.raises(ValidationError, match=rf"{name}: must be 0.001 to 2147483 s") as refused:
        Settings.from_env({variable: seconds})
    assert refused.value.field == name
    with pytest.raises(ValidationError, match=rf"{name}: must be 0.001 to 2147483 s"):
        Settings(**{name: float(seconds)})


def test_the_longest_and_shortest_server_timeouts_are_taken() -> None:
    assert Settings(statement_timeout_s=2147483, ready_timeout_s=0.001).statement_timeout_s == 2147483


def test_a_schema_name_too_long_for_the_read_models_schemas_is_refused_at_once() -> None:
    # (An outside probe: FLOWLEDGER_SCHEMA of 63 characters migrated and took steps, then
    # `flowledger projections rebuild` failed: "schema name '<it>_projections' is longer than 63
    # characters"; the dashboards and the funnel could never be built for it.)
    longest = "s" * MAX_SCHEMA_LENGTH
    names = Names(Settings(schema=longest).schema)
    derived = [names.control, names.reader, names.tenant("a tenant")]
    for projection in all_projections():
        derived += [names.scratch(projection.name), names.build(projection.name, 99)]
    assert max(len(name) for name in derived) <= 63
    with pytest.raises(ValidationError, match=r"schema: .* is 43 characters long; at most 42") as refused:
        Settings.from_env({"FLOWLEDGER_SCHEMA": "s" * 43})
    assert refused.value.field == "schema"


@pytest.mark.parametrize(
    "name", ["home", "audit_key_dir", "pricing_file", "skill_catalogue_file", "routing_file"]
)
def test_a_path_given_as_text_is_taken_as_a_path_and_anything_else_is_refused(name: str) -> None:
    # (An embedding probe: Settings(home="/srv/x") or audit_key_dir="/srv/keys" was taken as it
    # was, and the engine's first write raised TypeError "unsupported operand type(s) for /: 'str'
    # and 'str'", a traceback from deep inside.)
    assert getattr(Settings(**{name: "/srv/flowledger/x"}), name) == Path("/srv/flowledger/x")
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: 5})
    assert refused.value.field == name
