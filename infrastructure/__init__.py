"""flowledger infrastructure: the Engine, settings and persistence."""

from flowledger.infrastructure.engine.facade import Engine
from flowledger.infrastructure.history import HistoryEntry
from flowledger.infrastructure.settings import Settings

__all__ = ["Engine", "HistoryEntry", "Settings"]
