"""``require_path`` where the engine's modules have always imported it from (its home is
``flowledger.infrastructure.paths``, which the audit trail under ``postgres/`` reads too)."""

from __future__ import annotations

from flowledger.infrastructure.paths import require_path

__all__ = ["require_path"]
