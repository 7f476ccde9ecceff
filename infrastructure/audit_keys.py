"""The audit keys, held by the engine and never stored in the database.

- the chain key (HMAC-SHA256, 32 random bytes): seals every appended event's hash;
- the checkpoint signing key (Ed25519): signs checkpoints; its public key is published;
- retired public keys (``retired.pub``): the signing keys replaced by ``rotate_signing_key``
  (or by hand), still trusted for the checkpoints they signed before their successor's first.

Each comes from ``Settings`` (``FLOWLEDGER_CHAIN_KEY`` / ``FLOWLEDGER_SIGNING_KEY``, hex), else
from a file in ``Settings.key_dir`` (``chain.key``, ``checkpoint.key``; hex, mode 0600),
made on first use. A file is written under a temporary name and linked into place, so
processes starting at once agree on one key and never read half a file.
"""

from __future__ import annotations

import os
import secrets
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.settings import Settings

CHAIN_KEY_FILE = "chain.key"
SIGNING_KEY_FILE = "checkpoint.key"
PUBLIC_KEY_FILE = "checkpoint.pub"
RETIRED_KEYS_FILE = "retired.pub"


_VERIFY = "audit verify checks with the writers' keys"
"""What a command that reads the writers' keys does, for the line refusing a missing one."""


def chain_key(settings: Settings, *, make: bool = True, reader: str = _VERIFY) -> bytes:
    """The chain's HMAC key (made in ``key_dir`` on first use unless given; without ``make``,
    a missing one is a ValidationError saying what ``reader`` does: a check, or an engine on a
    log already sealed, must use the writers' key, not a new one)."""
    if settings.chain_key is not None:
        return settings.chain_key
    return _key_file(settings.key_dir / CHAIN_KEY_FILE, 32, "FLOWLEDGER_CHAIN_KEY", make=make, reader=reader)


@dataclass(frozen=True)
class SigningKey:
    """The checkpoints' Ed25519 key pair."""

    private: Ed25519PrivateKey

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def public_hex(self) -> str:
        """The public key as 64 hex digits: what ``python -m flowledger.verify --public-key`` takes."""
        return self.public_bytes.hex()

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``."""
        return self.private.sign(message)


def signing_key(settings: Settings, *, make: bool = True, reader: str = _VERIFY) -> SigningKey:
    """The checkpoint signing key (made in ``key_dir`` on first use unless given, or refused
    when missing without ``make``, the refusal saying what ``reader`` does); also writes the
    public key beside it (``checkpoint.pub``) for publication."""
    seed = settings.signing_key
    if seed is None:
        seed = _key_file(
            settings.key_dir / SIGNING_KEY_FILE, 32, "FLOWLEDGER_SIGNING_KEY", make=make, reader=reader
        )
    key = SigningKey(Ed25519PrivateKey.from_private_bytes(seed))
    public = settings.key_dir / PUBLIC_KEY_FILE
    if settings.signing_key is None and not public.exists():
        _write_new(public, key.public_hex + "\n", mode=0o644)
    return key


def retired_public_keys(settings: Settings) -> list[bytes]:
    """The checkpoint public keys retired from signing, oldest first: ``retired.pub`` in the key
    directory, 64 hex digits a line (``#`` starts a comment); none when there is no such file.
    A line that is not a key is a ValidationError naming the file and the line."""
    path = settings.key_dir / RETIRED_KEYS_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) else "not hex text"
        raise ValidationError("FLOWLEDGER_AUDIT_KEY_DIR", f"{path} cannot be read ({why or error})") from None
    keys: list[bytes] = []
    for number, line in enumerate(text.splitlines(), start=1):
        written = line.split("#", 1)[0].strip()
        if not written:
            continue
        try:
            raw = bytes.fromhex(written)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValidationError(
                "FLOWLEDGER_AUDIT_KEY_DIR",
                f"{path}, line {number}: not an Ed25519 public key (64 hex digits a line)",
            )
        keys.append(raw)
    return keys


def rotate_signing_key(settings: Settings) -> tuple[str, str]:
    """Retire the signing key of the key directory and put a new one in its place: the old
    public key is appended to ``retired.pub`` first (so it stays trusted for the checkpoints it
    signed), then ``checkpoint.key`` and ``checkpoint.pub`` are replaced whole. Returns the old
    and the new public key (hex). A key given in ``FLOWLEDGER_SIGNING_KEY`` is the secret
    store's to replace: a ValidationError saying how."""
    if settings.signing_key is not None:
        raise ValidationError(
            "FLOWLEDGER_SIGNING_KEY",
            "set in the environment: put the new key there, and append the old public key"
            f" (flowledger audit public-key) to {settings.key_dir / RETIRED_KEYS_FILE}",
        )
    current = settings.key_dir / SIGNING_KEY_FILE
    if not current.exists():
        raise ValidationError(
            "FLOWLEDGER_AUDIT_KEY_DIR", f"{current} does not exist: there is no signing key here to replace"
        )
    old = signing_key(settings, make=False)
    retired = settings.key_dir / RETIRED_KEYS_FILE
    with retired.open("a", encoding="ascii") as out:
        os.fchmod(out.fileno(), 0o644)
        out.write(old.public_hex + "\n")
        out.flush()
        os.fsync(out.fileno())
    new = SigningKey(Ed25519PrivateKey.generate())
    seed = new.private.private_bytes_raw()
    _replace(settings.key_dir / SIGNING_KEY_FILE, seed.hex() + "\n", mode=0o600)
    _replace(settings.key_dir / PUBLIC_KEY_FILE, new.public_hex + "\n", mode=0o644)
    return old.public_hex, new.public_hex


def _replace(path: Path, text: str, *, mode: int) -> None:
    """Write ``path`` whole under a temporary name and move it over the one there."""
    temporary = _written_aside(path, text, mode=mode)
    try:
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _key_file(path: Path, size: int, variable: str, *, make: bool = True, reader: str = _VERIFY) -> bytes:
    """The key in ``path``; a new random one written there (0600) when there is none and
    ``make``, else a ValidationError naming the variable, the file and what ``reader`` does."""
    if not path.exists() and not make:
        raise ValidationError(
            variable,
            f"not set, and {path} does not exist: {reader} and makes none (copy their key directory,"
            f" or set {variable})",
        )
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_new(path, secrets.token_bytes(size).hex() + "\n", mode=0o600)
        except OSError as error:
            raise ValidationError(
                variable, f"no key given and {path} cannot be created ({error.strerror or error})"
            ) from error
    try:
        key = bytes.fromhex(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError) as error:
        raise ValidationError(variable, f"{path} does not hold a hex key ({error})") from error
    if len(key) != size:
        raise ValidationError(variable, f"{path} holds {len(key)} bytes, not {size}")
    return key


def _write_new(path: Path, text: str, *, mode: int) -> None:
    """Write ``path`` only if it does not exist yet (the first writer wins, whole)."""
    temporary = _written_aside(path, text, mode=mode)
    try:
        with suppress(FileExistsError):  # another process made it first: use theirs
            os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _written_aside(path: Path, text: str, *, mode: int) -> Path:
    """``text`` written and synced to a new file beside ``path`` (a name of this process's own);
    its path. Nothing is left behind if the write fails."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary
