"""What every projection is: named tables built from events, written a batch at a time.

A projection's handlers depend only on the events (and on rows the projection itself
wrote earlier); the processor gives it each batch inside the transaction that also
moves its tracking position, so a batch is applied exactly once or not at all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from psycopg import Cursor

from flowledger.projections.calls import Call
from flowledger.projections.sql import q


@dataclass(frozen=True, slots=True)
class Envelope:
    """One decoded event, its position (notification id) in the log, and the model call it
    records, if any (worked out once per event, for every projection)."""

    id: int
    event: Any
    call: Call | None = None


class Projection(ABC):
    """A read model: DDL for its tables, and a batch handler that writes their rows."""

    name: ClassVar[str]
    """Stable name, used in schema names, the CLI and the tracking table."""

    exposed: ClassVar[tuple[str, ...]]
    """Tables that readers see, as views of the same name in the reader schema."""

    ddl: ClassVar[str]
    """CREATE statements; ``{s}`` stands for the (versioned) schema that holds the tables."""

    def create(self, cur: Cursor[Any], schema: str) -> None:
        """Create this projection's tables in ``schema`` (which exists)."""
        cur.execute(q(self.ddl, schema))

    @abstractmethod
    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Write the rows for ``batch`` (events in log order) into the tables in ``schema``."""
