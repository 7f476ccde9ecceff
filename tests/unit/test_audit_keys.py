"""The audit keys: given as hex in the environment, or made once in the key directory (0600)."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.audit_keys import chain_key, signing_key
from flowledger.infrastructure.settings import Settings


def test_keys_are_made_once_private_and_the_public_key_is_written_beside_them(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: chain_key(settings), range(16)))
    assert len(keys) == 1
    assert len(next(iter(keys))) == 32
    signing = signing_key(settings)
    assert signing_key(settings).public_hex == signing.public_hex
    folder = tmp_path / "home" / "keys"
    for name in ("chain.key", "checkpoint.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    assert (folder / "checkpoint.pub").read_text().strip() == signing.public_hex


def test_keys_given_in_the_environment_are_used_and_checked(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "FLOWLEDGER_HOME": str(tmp_path),
            "FLOWLEDGER_CHAIN_KEY": "ab" * 32,
            "FLOWLEDGER_SIGNING_KEY": "01" * 32,
            "FLOWLEDGER_AUDIT_CHAIN": "off",
            "FLOWLEDGER_CHECKPOINT_EVERY_EVENTS": "0",
        }
    )
    assert chain_key(settings) == bytes.fromhex("ab" * 32)
    expected = Ed25519PrivateKey.from_private_bytes(bytes.fromhex("01" * 32)).public_key()
    assert signing_key(settings).public_bytes == expected.public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert not settings.audit_chain
    assert settings.checkpoint_every_events == 0
    assert not (tmp_path / "keys").exists()
    with pytest.raises(ValidationError, match="FLOWLEDGER_SIGNING_KEY: must be exactly 32 bytes"):
        Settings.from_env({"FLOWLEDGER_SIGNING_KEY": "01" * 16})
    with pytest.raises(ValidationError, match="FLOWLEDGER_CHAIN_KEY: is not hexadecimal"):
        Settings.from_env({"FLOWLEDGER_CHAIN_KEY": "not hex"})


def test_a_damaged_key_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "chain.key").write_text("abcd\n")
    with pytest.raises(ValidationError, match="holds 2 bytes, not 32"):
        chain_key(Settings(audit_key_dir=tmp_path))
