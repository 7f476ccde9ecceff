"""Shared fixtures: a PostgreSQL URL, a fresh schema per test, engines on both backends.

PostgreSQL comes from FLOWLEDGER_TEST_DATABASE_URL when set, else the server at
127.0.0.1:5432, else an embedded server started for the test run; each pytest-xdist worker
works in a database of its own there (``test_gw0``, ...). Never skipped.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres import data_keys
from flowledger.infrastructure.postgres.database import migrate
from flowledger.infrastructure.postgres.embedded import embedded_database_url
from tests.support.databases import BackgroundDrops, worker_database
from tests.support.framework_caches import release_framework_caches
from tests.support.schemas import (
    RUN_PREFIX,
    drop_run_schemas,
    drop_schemas,
    schemas_starting_with,
    scratch_schema,
)

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/test"

# Hypothesis profiles: ``ci`` for every run of ``make test`` (and plain pytest), ``deep`` for
# ``make test-deep``. Tests set no ``max_examples`` of their own unless a run must stay small,
# so the profile decides how far exploration goes. No deadline: the machine is shared.
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The garbage collector runs less often in the test processes: at Python's thresholds
# (700, 10, 10) it took 7.4 s of 56.2 s of CPU in one process running six test files under
# coverage (651 tests; 32 full collections, 5.9 s, walking every engine, app and module the
# run had made), 1.8 s of 50.4 s at these, the process's peak memory 197 MB before, 230 MB
# after. CI's two cores are the suite's limit, so its CPU is its time.
gc.set_threshold(20_000, 50, 100)

DATABASE_FIXTURES = frozenset({"database_url", "pg_schema", "pg_engine"})


SLOW_FIRST = Path(__file__).with_name("slow_first.txt")


def slow_first_names() -> frozenset[str]:
    """The test functions listed in ``tests/slow_first.txt`` (``path::function``)."""
    lines = SLOW_FIRST.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reaches PostgreSQL through a fixture carries the ``postgres`` marker, and
    the tests known to take long run first, each module's followed by the rest of its module
    (the others keep their order).

    A module-scoped fixture is set up again whenever its module's tests are split: with only
    the listed test moved first, test_cli_demo.py ran the whole demo twice (6.7 and 8.2 s of
    set-up in the clean-clone CI run of 2026-12-07 at 14:49), test_pgbouncer.py started a
    second PgBouncer (20.8 s)."""
    for item in items:
        if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
    slow = slow_first_names()
    rank: dict[str, int] = {}
    for item in items:
        if item.nodeid.split("[", 1)[0] in slow:
            rank.setdefault(item.nodeid.split("::", 1)[0], len(rank))

    def place(item: pytest.Item) -> tuple[int, bool]:
        module = rank.get(item.nodeid.split("::", 1)[0])
        if module is None:
            return (len(rank), True)
        return (module, item.nodeid.split("[", 1)[0] not in slow)

    items.sort(key=place)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After each test, the web framework's caches of callables are emptied, so the apps the
    test made (and their engines) can be collected (``tests/support/framework_caches.py``)."""
    release_framework_caches()


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


NO_COMMIT_FLUSH = "-c synchronous_commit=off"
"""The test server's sessions do not wait for their commits' WAL to reach the disk: every test
commits often, and on a busy disk each commit's flush waited (test_budgets.py ran in 16-21 s
with it, 19-25 s without, on the shared machine of 2026-12-06). Nothing is lost unless the server
itself crashes, which no test does to it (the fault tests crash private servers, which keep
the default); what a commit makes visible, and when, is unchanged."""


def without_commit_flush(url: str) -> str:
    """``url`` with ``NO_COMMIT_FLUSH`` as its startup options (unchanged if it names options)."""
    if "options=" in url:
        return url
    if url.startswith(("postgresql://", "postgres://")):
        return f"{url}{'&' if '?' in url else '?'}options={quote(NO_COMMIT_FLUSH)}"
    return f"{url} options='{NO_COMMIT_FLUSH}'"


@pytest.fixture(scope="session")
def database_url(worker_id: str) -> str:
    """A PostgreSQL URL for the whole run (``without_commit_flush``), in a database of the
    pytest-xdist worker's own (``tests/support/databases.worker_database``)."""
    configured = os.environ.get("FLOWLEDGER_TEST_DATABASE_URL")
    if configured:
        server = configured
    elif _reachable(LOCAL_SERVER):
        server = LOCAL_SERVER
    else:
        server = embedded_database_url(_private_directory())
    return without_commit_flush(worker_database(server, worker_id))


def _private_directory() -> Path:
    """A directory for the run's embedded server, outside pytest's temporary root.

    pytest keeps only the three newest ``pytest-N`` roots and prunes older ones when a run
    starts, even while their run goes on: with several runs on one machine, a later run
    deleted an earlier run's data directory under its live server (connections dropped,
    "could not open pg_control"). Removed at exit, after the server (registered first, so
    it runs last).
    """
    path = Path(tempfile.mkdtemp(prefix="flowledger-test-pg-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@pytest.fixture(scope="session")
def run_schemas(database_url: str) -> Iterator[str]:
    """The prefix of every schema this run makes; at the end of the run, whatever a test left
    behind under it (a subprocess's schemas included) is dropped, and none may remain."""
    yield RUN_PREFIX
    left = drop_run_schemas(database_url)
    if left:
        print(f"\nswept {len(left)} schemas that tests left behind: {', '.join(left[:10])}")
    remaining = schemas_starting_with(database_url, RUN_PREFIX)
    assert not remaining, f"schemas of this run still in the database: {remaining}"


@pytest.fixture(scope="session")
def database_drops() -> Iterator[BackgroundDrops]:
    """Drops of the run's scratch databases, each in a thread (``tests/support/databases.py``):
    a module's teardown does not wait for the checkpoint a drop makes; the end of the run does."""
    drops = BackgroundDrops()
    yield drops
    drops.wait()


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest, database_url: str, run_schemas: str) -> Iterator[str]:
    """A schema of the test's own; it and the schemas named after it are dropped afterwards.

    Parametrised indirectly with a number of partitions (``tests/support/partitions.py``),
    the schema is first migrated to an events table hash-partitioned that many ways."""
    schema = scratch_schema()
    partitions = int(getattr(request, "param", 0))
    try:
        if partitions:
            report = migrate(database_url, schema, Settings(event_partitions=partitions))
            assert report.partitions == partitions
        yield schema
    finally:
        drop_schemas(database_url, schema)


TEST_KEY_DIR = Path(tempfile.mkdtemp(prefix="flowledger-test-keys-"))
"""The audit keys of this run's engines (chain key, checkpoint signing key): made on first use."""
atexit.register(shutil.rmtree, TEST_KEY_DIR, True)
# The CLI and server subprocesses of the e2e tests read the same keys as the tests' engines.
os.environ["FLOWLEDGER_AUDIT_KEY_DIR"] = str(TEST_KEY_DIR)


@pytest.fixture
def quick_purge(monkeypatch: pytest.MonkeyPatch) -> None:
    """``forget``'s purge waits at most 1 s (``data_keys.PURGE_WAIT_S``: 30 s), for a test that
    reads rows, never pages. The purge waits until no transaction open anywhere in the database
    (another run's on the same server included) can see the destroyed keys' old row versions:
    such a test took 31 s with one transaction held open elsewhere, 1-2 s without. A version it
    leaves is dead, seen by no read (``tests/integration/test_erasure.py`` reads the pages,
    waiting in full)."""
    monkeypatch.setattr(data_keys, "PURGE_WAIT_S", 1.0)


ENVIRONMENT_PATIENCE = {"operation_deadline_s": 60.0, "pool_timeout_s": 60.0}
"""The deadlines of test engines that do not set their own. The defaults (15 s, 5 s) are for a
service; on CI's shared server, checkpoints that sync the files of thousands of test schemas
stalled connections for up to 28 s, and tests that assert answers, not their speed, failed
with ``StoreUnavailable`` at an engine's start or a ``PoolTimeout`` (clean-clone runs of
2026-12-07). Tests of deadlines set theirs."""


def make_settings(**overrides: object) -> Settings:
    """Test settings that ignore the developer's environment, patient with the shared server."""
    base = Settings(home=Path("/nonexistent"), audit_key_dir=TEST_KEY_DIR)
    return base.with_overrides(**{**ENVIRONMENT_PATIENCE, **overrides})


def backend_engine(request: pytest.FixtureRequest, **overrides: object) -> Iterator[Engine]:
    """For a fixture parametrized ``["memory", "postgres"]``: an engine of ``overrides`` on
    ``request.param``'s backend (PostgreSQL in the test's own schema), closed afterwards."""
    if request.param == "memory":
        where: dict[str, object] = {"database_url": "memory:"}
    else:
        where = {
            "database_url": request.getfixturevalue("database_url"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    engine = Engine(settings=make_settings(**where, **overrides))
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def pg_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """An engine on real PostgreSQL, in its own schema."""
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def memory_http() -> Iterator[TestClient]:
    """The HTTP API (no keys required) over an in-memory engine, as a TestClient."""
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine)) as client:
        yield client
    engine.close()


@pytest.fixture(params=["memory", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The same test body against the in-memory and the PostgreSQL backend."""
    if request.param == "memory":
        memory = Engine(settings=make_settings(database_url="memory:"))
        try:
            yield memory
        finally:
            memory.close()
    else:
        yield request.getfixturevalue("pg_engine")
