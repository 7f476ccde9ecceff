"""An engine seals with the key its log is sealed with, or does not start.

An outside probe: a second engine on the same database and schema, on a host whose key
directory was not copied from the writers' (or with another installation's
``FLOWLEDGER_CHAIN_KEY``), made a chain key of its own at start; then every read it served
was ``StoredEventAltered`` (HTTP 500), and what it wrote was sealed under its key, so that
the writers read those sessions as altered and ``audit verify`` called them forged.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli


def written(database_url: str, pg_schema: str, steps: int = 3) -> None:
    """A session with ``steps`` steps, sealed under the run's test key."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        for n in range(steps):
            engine.record_step("s-1", f"step-{n}", input={}, output={})


def rows(database_url: str, pg_schema: str) -> int:
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            SQL("SELECT count(*) FROM {}").format(Identifier(pg_schema, "flowledger_events"))
        ).fetchone()
        assert found is not None
        return int(found[0])


def test_an_engine_without_the_writers_key_refuses_to_start_and_makes_none(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a log sealed by the writers
    written(database_url, pg_schema)
    before = rows(database_url, pg_schema)
    elsewhere = tmp_path / "keys"
    # When an engine starts on a host without their key
    settings = make_settings(database_url=database_url, schema=pg_schema, audit_key_dir=elsewhere)
    with pytest.raises(ValidationError, match="FLOWLEDGER_CHAIN_KEY") as refused:
        Engine(settings=settings)
    # Then it says what is missing and where, and makes no key to seal with
    assert "does not exist" in str(refused.value)
    assert "writers' key" in str(refused.value)
    assert not (elsewhere / "chain.key").exists()
    assert rows(database_url, pg_schema) == before


def test_an_engine_with_another_chain_key_refuses_to_start(database_url: str, pg_schema: str) -> None:
    # Given a log sealed by the writers
    written(database_url, pg_schema)
    before = rows(database_url, pg_schema)
    # When an engine starts with another installation's chain key
    settings = make_settings(database_url=database_url, schema=pg_schema, chain_key=bytes(range(32)))
    with pytest.raises(ValidationError, match="not the key the log was sealed with"):
        Engine(settings=settings)
    # Then nothing was written; and the writers' key still starts
    assert rows(database_url, pg_schema) == before
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.get_session("s-1").step_count == 3


def test_the_first_engine_on_a_log_not_sealed_yet_makes_its_key(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "keys"
    settings = make_settings(database_url=database_url, schema=pg_schema, audit_key_dir=elsewhere)
    with Engine(settings=settings) as engine:
        engine.start_session("s-1", "cs")
    assert (elsewhere / "chain.key").exists()
    with Engine(settings=settings) as engine:  # and the next one on that host seals with it
        assert engine.get_session("s-1").version == 1


def test_one_altered_newest_row_does_not_stop_the_writers_starting(database_url: str, pg_schema: str) -> None:
    # Given a log whose newest row's seal was replaced in the database
    written(database_url, pg_schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            SQL(
                "UPDATE {t} SET event_mac = decode(repeat('00', 32), 'hex')"
                " WHERE notification_id = (SELECT max(notification_id) FROM {t})"
            ).format(t=Identifier(pg_schema, "flowledger_events"))
        )
    # When an engine with the writers' key starts, then it starts (the older seals check under
    # its key) and the altered row is refused where it is read, as before
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert engine.log.head() >= 4


def test_a_cli_read_without_the_writers_key_is_one_line_and_exit_2(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    written(database_url, pg_schema)
    elsewhere = tmp_path / "keys"
    result = run_cli(
        database_url, pg_schema, "history", "s-1", env={"FLOWLEDGER_AUDIT_KEY_DIR": str(elsewhere)}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: FLOWLEDGER_CHAIN_KEY: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not elsewhere.exists() or not (elsewhere / "chain.key").exists()


def test_a_chain_key_lost_for_good_is_replaced_only_when_the_operator_says_so(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a log sealed under a key that is now lost
    written(database_url, pg_schema)
    elsewhere = tmp_path / "keys"
    settings = make_settings(database_url=database_url, schema=pg_schema, audit_key_dir=elsewhere)
    # When one engine starts saying the key is replaced, it makes a new key and seals with it
    with Engine(settings=settings.with_overrides(chain_key_replaced=True)) as engine:
        engine.start_session("s-2", "cs")
        engine.record_step("s-2", "after", input={}, output={})
    assert (elsewhere / "chain.key").exists()
    # Then engines with the new key start without the setting (the newest rows are sealed by it)
    with Engine(settings=settings) as engine:
        assert engine.get_session("s-2").step_count == 1
