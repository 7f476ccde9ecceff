"""``audit verify`` checks with the keys the writers used and makes none: run where the key
directory is missing, it once made new keys there (which engines on that host would then have
sealed and signed with) and called every stream forged; under another chain key it says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flowledger.infrastructure import Engine
from tests.conftest import TEST_KEY_DIR, make_settings
from tests.support.cli import run_cli


@pytest.fixture
def written(database_url: str, pg_schema: str) -> None:
    """Three sessions and a checkpoint, written with the test key directory's keys."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        for n in range(3):
            engine.start_session(f"s-{n}", "support", user_id=f"u-{n}")
            engine.record_step(f"s-{n}", "answer", input={"q": n}, output={"a": n})
        engine.audit.checkpoint()


@pytest.mark.usefixtures("written")
@pytest.mark.parametrize("extra", [[], ["--public-key", "00" * 32]], ids=["keys", "public-key-given"])
def test_audit_verify_where_the_key_directory_is_missing_refuses_and_makes_no_key(
    database_url: str, pg_schema: str, tmp_path: Path, extra: list[str]
) -> None:
    # Given a host without the writers' key directory
    missing = tmp_path / "keys"
    # When the log is verified there
    result = run_cli(
        database_url, pg_schema, "audit", "verify", *extra, env={"FLOWLEDGER_AUDIT_KEY_DIR": str(missing)}
    )
    # Then it says which key is missing, in one line, exit 2, and writes no key
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: FLOWLEDGER_CHAIN_KEY: "), lines
    assert str(missing / "chain.key") in lines[0]
    assert "makes none" in lines[0]
    assert not missing.exists()


@pytest.mark.usefixtures("written")
def test_a_bundle_checked_where_the_signing_key_is_missing_refuses_and_makes_no_key(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    bundle = tmp_path / "all.jsonl"
    assert run_cli(database_url, pg_schema, "audit", "export", "--out", str(bundle)).returncode == 0
    missing = tmp_path / "keys"
    result = run_cli(
        database_url,
        pg_schema,
        "audit",
        "verify",
        "--file",
        str(bundle),
        env={"FLOWLEDGER_AUDIT_KEY_DIR": str(missing)},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: FLOWLEDGER_SIGNING_KEY: "), result.stderr
    assert not missing.exists()


@pytest.mark.usefixtures("written")
def test_audit_verify_under_another_chain_key_says_the_key_is_not_the_writers(
    database_url: str, pg_schema: str
) -> None:
    result = run_cli(database_url, pg_schema, "audit", "verify", env={"FLOWLEDGER_CHAIN_KEY": "11" * 32})
    assert result.returncode == 1, result.stderr
    assert "no event's seal checks under this chain key" in result.stderr, result.stderr


def test_a_log_without_checkpoints_is_verified_with_the_chain_key_alone(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a log written without a checkpoint, and a key directory holding only the chain key
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "support")
    keys = tmp_path / "keys"
    keys.mkdir()
    shutil.copy(TEST_KEY_DIR / "chain.key", keys / "chain.key")
    # When it is verified, Then it passes, and no signing key was made for it
    result = run_cli(database_url, pg_schema, "audit", "verify", env={"FLOWLEDGER_AUDIT_KEY_DIR": str(keys)})
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in keys.iterdir()) == ["chain.key"]


def test_audit_public_key_where_the_key_directory_is_missing_refuses_and_makes_no_key(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # (It started an engine, which made a new chain key and signing key there and printed a
    # public key that signed nothing: the README's `--public-key "$(flowledger audit public-key)"`
    # then failed every bundle, and engines on that host would have sealed under the new keys.)
    # Given a host without the writers' key directory
    missing = tmp_path / "keys"
    # When the public key is asked for there
    result = run_cli(
        database_url, pg_schema, "audit", "public-key", env={"FLOWLEDGER_AUDIT_KEY_DIR": str(missing)}
    )
    # Then it says which key is missing, in one line, exit 2, and writes no key
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: FLOWLEDGER_SIGNING_KEY: "), lines
    assert str(missing / "checkpoint.key") in lines[0]
    assert "audit public-key" in lines[0], lines
    assert not missing.exists()


@pytest.mark.usefixtures("written")
def test_audit_public_key_prints_the_key_the_writers_checkpoints_are_signed_with(
    database_url: str, pg_schema: str
) -> None:
    result = run_cli(database_url, pg_schema, "audit", "public-key")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (TEST_KEY_DIR / "checkpoint.pub").read_text().strip()


@pytest.mark.usefixtures("written")
def test_audit_checkpoints_where_the_key_directory_is_missing_exports_them_and_makes_no_key(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # (It started an engine, which made both keys there, and ended with that new key as "public key".)
    missing = tmp_path / "keys"
    out = tmp_path / "anchors.jsonl"
    result = run_cli(
        database_url,
        pg_schema,
        "audit",
        "checkpoints",
        "--out",
        str(out),
        env={"FLOWLEDGER_AUDIT_KEY_DIR": str(missing)},
    )
    assert result.returncode == 0, result.stderr
    assert len(out.read_text().splitlines()) == 1
    assert "exported 1 checkpoints" in result.stderr
    assert "public key" not in result.stderr
    assert not missing.exists()
