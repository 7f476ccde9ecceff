"""``flowledger serve``, ``keys revoke`` and the settings' environment refuse bad input the CLI's way.

One line on stderr starting ``error:``, an exit code from the table in ``adapters/cli/errors.py``,
and for ``serve`` nothing started first: the command returns at once, with no simulator announced.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from time import monotonic

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

FLOWLEDGER = str(Path(sys.executable).parent / "flowledger")
PROMPTLY_S = 30
"""A refused ``serve`` returns well within this; one that started would run until killed."""


def run(
    database_url: str, schema: str, home: Path, *args: str, tenant: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``flowledger *args`` on the test's schema and home; ``tenant`` sets FLOWLEDGER_TENANT."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"FLOWLEDGER_API_KEYS", "FLOWLEDGER_LLM_BASE_URL", "FLOWLEDGER_TENANT"}
    }
    env |= {
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": schema,
        "FLOWLEDGER_HOME": str(home),
        # Narrow on purpose: an error line must stay one line however long it is.
        "COLUMNS": "80",
    }
    if tenant is not None:
        env["FLOWLEDGER_TENANT"] = tenant
    return subprocess.run(
        [FLOWLEDGER, *args], env=env, capture_output=True, text=True, timeout=PROMPTLY_S, check=False
    )


def the_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line on stderr, after checking it is the only one and nothing went to stdout."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize("host", ["0.0.0.0", ""])
def test_serve_refuses_a_network_address_without_keys_in_one_line_before_starting_anything(
    database_url: str, pg_schema: str, tmp_path: Path, free_port: int, host: str
) -> None:
    # Given a schema with no API key
    # When serve is asked to listen on a non-loopback address
    result = run(database_url, pg_schema, tmp_path, "serve", "--host", host, "--port", str(free_port))
    # Then it exits 2 with one line about the host, the simulator never announced
    assert result.returncode == 2, result.stderr
    line = the_error_line(result)
    assert line.startswith("error: host: no API key is configured: refusing to serve")
    assert "--insecure" in line


def test_serve_refuses_a_client_setting_it_cannot_read_in_one_line_before_starting_anything(
    database_url: str, pg_schema: str, tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model-client setting in the environment that does not read
    monkeypatch.setenv("FLOWLEDGER_LLM_MAX_RETRIES", "three")
    # When serve starts, Then it exits 2 with one line naming the variable
    result = run(database_url, pg_schema, tmp_path, "serve", "--port", str(free_port))
    assert result.returncode == 2, result.stderr
    assert the_error_line(result) == "error: FLOWLEDGER_LLM_MAX_RETRIES: must be a whole number, got 'three'"


def test_serve_refuses_an_unknown_http_parser_naming_the_option_and_its_values(
    database_url: str, pg_schema: str, tmp_path: Path, free_port: int
) -> None:
    # Given a parser name uvicorn would take for an import string
    # When serve is asked for it
    result = run(database_url, pg_schema, tmp_path, "serve", "--http", "bogus", "--port", str(free_port))
    # Then it exits 2 with one line naming --http and the values it takes
    assert result.returncode == 2, result.stderr
    assert the_error_line(result) == "error: http: 'bogus' is not one of auto, h11, httptools"


@pytest.mark.parametrize(
    ("where", "field"),
    # 192.0.2.1 (TEST-NET-1) is no address of this host: the host's fault, it named the port
    [("taken", "port"), ("nosuch.invalid", "host"), ("192.0.2.1", "host")],
)
def test_serve_refuses_an_address_it_cannot_listen_on_in_one_line_before_starting_anything(
    database_url: str, pg_schema: str, tmp_path: Path, taken_port: int, free_port: int, where: str, field: str
) -> None:
    # Given a port another socket holds, or a host name that does not resolve
    host, port = ("127.0.0.1", taken_port) if where == "taken" else (where, free_port)
    # When serve is asked to listen there
    result = run(database_url, pg_schema, tmp_path, "serve", "--host", host, "--port", str(port))
    # Then it exits 2 with one line saying where it cannot listen, and no uvicorn log
    assert result.returncode == 2, result.stderr
    line = the_error_line(result)
    assert line.startswith(f"error: {field}: cannot listen on {host}:{port}: ")


@pytest.mark.parametrize("key_id", ["nosuchkey", "k" * 3000])
def test_revoking_an_unknown_key_exits_3_with_one_shortened_error_line(
    database_url: str, pg_schema: str, tmp_path: Path, key_id: str
) -> None:
    # Given no key with that id
    # When it is revoked
    result = run(database_url, pg_schema, tmp_path, "keys", "revoke", key_id)
    # Then it exits 3 with one line on stderr, the id shortened when very long
    assert result.returncode == 3, result.stderr
    line = the_error_line(result)
    if len(key_id) < 40:
        assert line == "error: no active key 'nosuchkey'"
    else:
        assert line == f"error: no active key {'k' * 40!r}… (3000 characters)"


@pytest.mark.parametrize(
    ("variable", "default"), [("FLOWLEDGER_SCHEMA", "flowledger"), ("FLOWLEDGER_TENANT", "default")]
)
def test_a_schema_or_tenant_set_but_empty_is_refused_not_taken_for_the_default(
    database_url: str, pg_schema: str, tmp_path: Path, variable: str, default: str
) -> None:
    # Given the variable set to the empty string (as an unset shell variable expands)
    schema, tenant = ("", None) if variable == "FLOWLEDGER_SCHEMA" else (pg_schema, "")
    label = f"empty-{uuid.uuid4().hex}"
    # When a command that writes runs
    create = ["keys", "create", "--tenant", "acme", "--role", "reader", "--label", label]
    result = run(database_url, schema, tmp_path, *create, tenant=tenant)
    # Then it is refused at once with one line, and no key was written to the default schema
    assert result.returncode == 2, result.stderr
    expected = f"error: {variable}: must not be empty (unset it for the default, {default!r})"
    assert the_error_line(result) == expected
    with psycopg.connect(database_url, autocommit=True) as conn:
        table = conn.execute("SELECT to_regclass('flowledger.api_keys')").fetchone()
        if table is not None and table[0] is not None:
            query = "SELECT count(*) FROM flowledger.api_keys WHERE label = %s"
            assert conn.execute(query, [label]).fetchone() == (0,)


REFUSED = {"database": ("dbname", "nosuchdb_clifix"), "role": ("user", "nosuchrole_clifix")}
POOL_WAIT_S = 60
"""The pool wait the refusal tests allow: a command that waited on the pool would take all of it.
Half of it is the bound the refusal must come within, the process's start included: at 20 s
(10 s), `serve` once took 10.6 s to start and refuse in a clean-clone CI run on a loaded
machine (its imports alone take seconds there)."""


@pytest.mark.parametrize("what", sorted(REFUSED))
@pytest.mark.parametrize("command", ["keys list", "keys revoke abc", "serve"])
def test_a_database_that_refuses_the_login_stops_keys_and_serve_at_once_naming_the_cause(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    free_port: int,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    command: str,
) -> None:
    # Given a database URL naming a database (or a role) the server does not have, and a long pool wait
    field, value = REFUSED[what]
    refused_url = make_conninfo("", **{**conninfo_to_dict(database_url), field: value})
    monkeypatch.setenv("FLOWLEDGER_POOL_TIMEOUT_S", str(POOL_WAIT_S))
    monkeypatch.setenv("FLOWLEDGER_OPERATION_DEADLINE_S", str(POOL_WAIT_S + 5))
    args = command.split() + (["--port", str(free_port)] if command == "serve" else [])
    # When the command runs
    started = monotonic()
    result = run(refused_url, pg_schema, tmp_path, *args)
    took = monotonic() - started
    # Then it exits 1 (not 75: waiting will not mend it) with one line naming the cause and the
    # setting, long before the pool's wait would have ended (the process's start included)
    assert result.returncode == 1, result.stderr
    line = the_error_line(result)
    assert line.startswith("error: the database refused the connection"), line
    assert f'{what} "{value}" does not exist' in line
    assert "FLOWLEDGER_DATABASE_URL" in line
    assert took < POOL_WAIT_S / 2, took
