"""Paths a caller gives (an archive's directory, a bundle), checked before any file is touched."""

from __future__ import annotations

import os
from pathlib import Path

from flowledger.domain.bounds import shown
from flowledger.domain.errors import ValidationError


def require_path(field_name: str, value: object) -> Path:
    """``value`` as a Path, or a ValidationError naming the field (not pathlib's TypeError)."""
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ValidationError(field_name, f"must be a path, got {shown(value)}")
    try:
        encoded = os.fsencode(value)
    except (TypeError, UnicodeEncodeError):  # a lone surrogate the file system cannot encode
        raise ValidationError(
            field_name, f"must be a path the file system can encode: {shown(value)}"
        ) from None
    if b"\x00" in encoded:  # open() had raised ValueError "embedded null byte"
        raise ValidationError(field_name, f"must not contain NUL characters, got {shown(value)}")
    return Path(value)
