"""A new checkpoint signing key (rotated, or made after the old one was lost) does not make every
later ``audit verify`` fail: the old public key, retired, stays trusted for the checkpoints it
signed, and for none after its successor's first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import AuditError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit_keys import SigningKey
from flowledger.infrastructure.postgres.checkpoints import pack_heads
from flowledger.infrastructure.settings import Settings
from flowledger.verify import signed_message, statement_bytes, statement_digest
from tests.conftest import make_settings
from tests.support.cli import run_cli


@dataclass
class Keyed:
    """A log with one checkpoint, written with keys of its own (the test may replace them)."""

    url: str
    schema: str
    keys: Path
    settings: Settings

    @property
    def env(self) -> dict[str, str]:
        return {"FLOWLEDGER_AUDIT_KEY_DIR": str(self.keys)}

    def verify(self, *extra: str) -> tuple[int, str]:
        result = run_cli(self.url, self.schema, "audit", "verify", *extra, env=self.env)
        return result.returncode, result.stderr

    def write_and_checkpoint(self, session: str) -> int:
        with Engine(settings=self.settings) as engine:
            engine.start_session(session, "support")
            engine.record_step(session, "answer", input={"q": session})
            return engine.audit.checkpoint().seq


@pytest.fixture
def keyed(database_url: str, pg_schema: str, tmp_path: Path) -> Keyed:
    keys = tmp_path / "keys"
    settings = make_settings(
        database_url=database_url,
        schema=pg_schema,
        audit_key_dir=keys,
        checkpoint_every_events=0,
        checkpoint_every_s=0,
    )
    log = Keyed(database_url, pg_schema, keys, settings)
    assert log.write_and_checkpoint("before") == 1
    return log


def test_a_signing_key_rotated_by_the_command_keeps_every_checkpoint_proven(keyed: Keyed) -> None:
    old = (keyed.keys / "checkpoint.pub").read_text().strip()
    # Given an engine running since before the rotation
    with Engine(settings=keyed.settings) as running:
        running.start_session("during", "support")
        # When the signing key is replaced
        rotated = run_cli(keyed.url, keyed.schema, "audit", "rotate-signing-key", env=keyed.env)
        assert rotated.returncode == 0, rotated.stderr
        new = (keyed.keys / "checkpoint.pub").read_text().strip()
        assert new != old
        assert new in rotated.stderr
        # Then the engine's next checkpoint is signed with the new key
        taken = running.audit.checkpoint()
        assert (taken.seq, taken.statement["public_key"]) == (2, new)
    # And the log verifies, proven by the latest checkpoint
    code, said = keyed.verify()
    assert code == 0, said
    assert "latest checkpoint: 2" in said
    assert run_cli(keyed.url, keyed.schema, "audit", "public-key", env=keyed.env).stdout.strip() == new


def test_a_signing_key_lost_and_made_again_keeps_the_old_checkpoints_proven_once_its_public_key_is_retired(
    keyed: Keyed,
) -> None:
    """docs/audit.md: 'losing the signing key only means starting a new checkpoint series with a
    new public key'. Every later audit verify said 'checkpoint 1: the signature is not valid for
    the public key' and 'checkpoint 2 does not follow the one before it' (exit 1), with no way out."""
    # Given the signing key lost, its published public key kept
    old = (keyed.keys / "checkpoint.pub").read_text()
    (keyed.keys / "checkpoint.key").unlink()
    (keyed.keys / "checkpoint.pub").unlink()
    # (a new key does not sign over the old one's checkpoints until that is retired)
    with pytest.raises(AuditError, match="its old public key is missing from"):
        keyed.write_and_checkpoint("after")
    # When the old public key is retired (as the docs say), a new key signs and the log is verified
    (keyed.keys / "retired.pub").write_text(old)
    assert keyed.write_and_checkpoint("after-retired") == 2
    code, said = keyed.verify()
    # Then every checkpoint is trusted
    assert code == 0, said
    assert "latest checkpoint: 2" in said


def sign_next_checkpoint_with(keyed: Keyed, seed: bytes) -> None:
    """Insert the next checkpoint row, linked to the latest and signed with ``seed``, by SQL (as
    whoever holds that key and the database would: no engine builds on it)."""
    table = Identifier(keyed.schema, "flowledger_checkpoints")
    with psycopg.connect(keyed.url, autocommit=True) as conn:
        row = conn.execute(
            SQL("SELECT seq, position, statement FROM {} ORDER BY seq DESC LIMIT 1").format(table)
        )
        seq, position, stored = row.fetchone() or (0, 0, b"{}")
        latest = json.loads(bytes(stored))
        key = SigningKey(Ed25519PrivateKey.from_private_bytes(seed))
        statement = dict(latest, seq=seq + 1, previous=statement_digest(latest), public_key=key.public_hex)
        conn.execute(
            SQL(
                "INSERT INTO {} (seq, position, statement, signature, heads) VALUES (%s, %s, %s, %s, %s)"
            ).format(table),
            (
                seq + 1,
                position,
                statement_bytes(statement),
                key.sign(signed_message(statement)),
                pack_heads({}),
            ),
        )


def test_a_checkpoint_signed_by_a_retired_key_after_its_successor_is_not_trusted(keyed: Keyed) -> None:
    # Given the key rotated, a checkpoint by the new key, then one by whoever kept the old key
    old_seed = bytes.fromhex((keyed.keys / "checkpoint.key").read_text().strip())
    assert run_cli(keyed.url, keyed.schema, "audit", "rotate-signing-key", env=keyed.env).returncode == 0
    assert keyed.write_and_checkpoint("after") == 2
    sign_next_checkpoint_with(keyed, old_seed)
    # When the log is verified
    code, said = keyed.verify()
    # Then checkpoint 3 is named, and checkpoint 2 is the latest trusted
    assert code == 1, said
    assert "checkpoint 3: signed by a retired key after checkpoint 2 was signed by a later one" in said
    assert "latest checkpoint: 2" in said


def test_a_retired_key_file_that_is_not_keys_is_one_line_and_exit_2(keyed: Keyed) -> None:
    (keyed.keys / "retired.pub").write_text("# retired 2026-12\nnot a key\n")
    code, said = keyed.verify()
    assert code == 2, said
    assert said.strip().splitlines() == [
        f"error: FLOWLEDGER_AUDIT_KEY_DIR: {keyed.keys / 'retired.pub'}, line 2: not an Ed25519 public key"
        " (64 hex digits a line)"
    ]


def test_a_signing_key_from_the_environment_is_not_rotated_by_the_command(keyed: Keyed) -> None:
    result = run_cli(
        keyed.url,
        keyed.schema,
        "audit",
        "rotate-signing-key",
        env={**keyed.env, "FLOWLEDGER_SIGNING_KEY": "22" * 32},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: FLOWLEDGER_SIGNING_KEY: set in the environment:"), result.stderr
    assert not (keyed.keys / "retired.pub").exists()


def test_rotating_where_there_is_no_signing_key_says_so_in_one_line(keyed: Keyed, tmp_path: Path) -> None:
    """It said 'audit verify checks with the writers' keys and makes none', of another command."""
    missing = tmp_path / "elsewhere"
    result = run_cli(
        keyed.url, keyed.schema, "audit", "rotate-signing-key", env={"FLOWLEDGER_AUDIT_KEY_DIR": str(missing)}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: FLOWLEDGER_AUDIT_KEY_DIR: {missing / 'checkpoint.key'} does not exist: there is no signing"
        " key here to replace"
    ]
    assert not missing.exists()


def test_a_bundle_exported_before_a_rotation_is_checked_with_the_retired_key(
    keyed: Keyed, tmp_path: Path
) -> None:
    bundle = tmp_path / "before.jsonl"
    exported = run_cli(keyed.url, keyed.schema, "audit", "export", "--out", str(bundle), env=keyed.env)
    assert exported.returncode == 0, exported.stderr
    old = (keyed.keys / "checkpoint.pub").read_text().strip()
    assert run_cli(keyed.url, keyed.schema, "audit", "rotate-signing-key", env=keyed.env).returncode == 0
    # Without --public-key: the current key, then the retired ones
    checked = run_cli(keyed.url, keyed.schema, "audit", "verify", "--file", str(bundle), env=keyed.env)
    assert checked.returncode == 0, checked.stderr
    # With the new key named, it is not this key's bundle
    new = (keyed.keys / "checkpoint.pub").read_text().strip()
    named = run_cli(
        keyed.url, keyed.schema, "audit", "verify", "--file", str(bundle), "--public-key", new, env=keyed.env
    )
    assert named.returncode == 1, named.stderr
    assert (
        run_cli(
            keyed.url,
            keyed.schema,
            "audit",
            "verify",
            "--file",
            str(bundle),
            "--public-key",
            old,
            env=keyed.env,
        ).returncode
        == 0
    )
