"""What every projection is: named tables built from events, written a batch at a time.

A projection's handlers depend only on the events (and on rows the projection itself
wrote earlier); the processor gives it each batch inside the transaction that also
moves its tracking position, so a batch is applied exactly once or not at all.

A projection names the event classes it handles (``handles``); the processor reads only
those topics from the log and gives it only those events, so an event class it does not
know (a newer writer's) never reaches it, and a build's rows never depend on what other
projections were run beside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic
from psycopg import Cursor

# Imported for their aggregates: ``known_topics`` finds them among FlowledgerAggregate's subclasses.
from flowledger.domain import agent, budget, session, task  # noqa: F401
from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.projections.calls import Call
from flowledger.projections.sql import q


@dataclass(frozen=True, slots=True)
class Envelope:
    """One decoded event, its position (notification id) in the log, and the model call it
    records, if any (worked out once per event, for every projection)."""

    id: int
    event: Any
    call: Call | None = None
    topic: str = ""


class Projection(ABC):
    """A read model: DDL for its tables, and a batch handler that writes their rows."""

    name: ClassVar[str]
    """Stable name, used in schema names, the CLI and the tracking table."""

    exposed: ClassVar[tuple[str, ...]]
    """Tables that readers see, as views of the same name in the reader schema."""

    ddl: ClassVar[str]
    """CREATE statements; ``{s}`` stands for the (versioned) schema that holds the tables."""

    schema_version: ClassVar[int] = 1
    """Bumped whenever ``ddl`` changes: an installed build of an older version is replaced and
    rebuilt from the log."""

    base_versions: ClassVar[tuple[int, ...]] = ()
    """Older schema versions whose captured rows of archived sessions fit this version's tables
    unchanged (a bump that changed only derived tables): their bases are used as this
    version's (``projections/archived.py``)."""

    base_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    """Per table, the columns added since a ``base_versions`` version (a new token type), with
    the value a row captured before them takes (their ``DEFAULT``): a base's rows are read as
    JSON, where a key left out would be NULL."""

    handles: ClassVar[tuple[type[Any], ...]]
    """Event classes whose events change this projection's rows; an aggregate class stands
    for every event class it defines."""

    @cached_property
    def topics(self) -> frozenset[str]:
        """The stored topics of the events in ``handles``."""
        return event_topics(*self.handles)

    def create(self, cur: Cursor[Any], schema: str) -> None:
        """Create this projection's tables in ``schema`` (which exists)."""
        cur.execute(q(self.ddl, schema))

    def rebased(self, cur: Cursor[Any], schema: str) -> None:
        """Derive what depends on the archived sessions' rows just put into the empty build
        ``schema`` (roll-ups); nothing by default (``projections/archived.py``)."""
        return None

    @abstractmethod
    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        """Write the rows for ``batch`` (events in log order) into the tables in ``schema``."""


def known_topics() -> frozenset[str]:
    """Every topic this release stores an event under: the event classes of each aggregate.
    A row of any other topic was written by a newer release, or had its topic edited."""
    classes: list[type[Any]] = []
    todo: list[type[Any]] = [FlowledgerAggregate]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    return event_topics(*classes)


def event_topics(*classes: type[Any]) -> frozenset[str]:
    """Topics of event classes; an aggregate class stands for all the event classes it defines."""
    topics: set[str] = set()
    for cls in classes:
        if issubclass(cls, Aggregate):
            nested = (v for v in vars(cls).values() if isinstance(v, type) and issubclass(v, cls.Event))
            topics.update(get_topic(event) for event in nested)
        else:
            topics.add(get_topic(cls))
    return frozenset(topics)
