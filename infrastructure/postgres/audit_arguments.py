"""What the audit trail's callers give it (streams, keys, a bundle's lines), checked before any
file or row is read: a wrong type is a ValidationError naming the argument, never the TypeError,
AttributeError or PostgreSQL error it met further in (``engine.audit.checked_bundle(5)`` had
raised "'int' object is not iterable", ``verify_chain(trail, stream="s1")`` "invalid input
syntax for type uuid")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from flowledger.domain.bounds import shown
from flowledger.domain.errors import ValidationError

KEY_BYTES = 32
"""An Ed25519 public key, as every checkpoint names one (``audit_keys.py``)."""


def _listed(field_name: str, value: Any, what: str) -> list[Any]:
    """``value`` as a list, unless it is a single string or bytes, or nothing to iterate."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence | set | frozenset):
        raise ValidationError(field_name, f"must be a list of {what}, got {shown(value)}")
    return list(value)


def require_streams(field_name: str, value: Any) -> list[UUID]:
    """``value`` as a list of aggregate ids (UUIDs), or a ValidationError naming the field."""
    streams = _listed(field_name, value, "aggregate ids (UUIDs)")
    for stream in streams:
        if not isinstance(stream, UUID):
            raise ValidationError(
                field_name, f"must be a list of aggregate ids (UUIDs), got {shown(stream)} in it"
            )
    return streams


def require_stream(field_name: str, value: Any) -> UUID:
    """``value`` as one aggregate id (a UUID: ``engine.session_uuid(session_id)``)."""
    if not isinstance(value, UUID):
        raise ValidationError(
            field_name, f"must be an aggregate id (a UUID, as engine.session_uuid gives), got {shown(value)}"
        )
    return value


def require_lines(field_name: str, value: Any) -> list[str]:
    """``value`` as a list of text lines (a bundle read and split), not one string read a
    character a line."""
    lines = _listed(field_name, value, "text lines")
    for line in lines:
        if not isinstance(line, str):
            raise ValidationError(field_name, f"must be a list of text lines, got {shown(line)} in it")
    return lines


def require_public_key(field_name: str, value: Any) -> bytes:
    """``value`` as a raw Ed25519 public key: 32 bytes (``bytes.fromhex`` of a hex one)."""
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise ValidationError(
            field_name,
            f"must be a public key of {KEY_BYTES} bytes (bytes.fromhex of its hex), got {shown(value)}",
        )
    return value


def require_needles(field_name: str, value: Any) -> list[bytes]:
    """``value`` as a list of non-empty byte strings to search stored bytes for: a string is
    read as no list of its characters, and an empty needle, found in everything, is refused."""
    needles = _listed(field_name, value, "non-empty byte strings")
    for needle in needles:
        if not isinstance(needle, bytes) or not needle:
            raise ValidationError(
                field_name, f"must be a list of non-empty byte strings, got {shown(needle)} in it"
            )
    return needles
