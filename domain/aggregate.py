"""The base of flowledger's aggregates: every event carries its command's id and one clock's time.

The store opens a command on an aggregate with ``begin(command_id, now)`` before calling
one of its methods, and closes it with ``end()``. Every event the method triggers then

- carries ``command_id`` (an attribute stored with the event's other fields, not a
  dataclass field, so adding it changed no event's class version): after an unknown
  commit outcome the store reads the stream back and knows its own events;
- is stamped ``max(now, the stream's last timestamp)``: one clock (the engine's), never
  running backwards within a stream, whatever the writing host's wall clock says.

Events replayed from the log keep what they were stored with; events of old logs have
no ``command_id`` and read as ``None``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from eventsourcing.domain import Aggregate

ENGINE_COMMAND_PREFIX = "cmd-"
"""How the ids the engine makes for commands without a caller's key begin: this prefix and 32
lowercase hex digits (``infrastructure/engine/command_ids.py``; a uuid4's hex before it)."""
_ENGINE_MADE = re.compile(ENGINE_COMMAND_PREFIX + "[0-9a-f]{32}")


def made_by_engine(command_id: str) -> bool:
    """Whether ``command_id`` has the shape of an id the engine made for a command without a
    caller's key. A caller's key may have it too (nothing forbids it): whoever rules such an id
    out of a key filter must look a key of this shape up another way."""
    return command_id.startswith(ENGINE_COMMAND_PREFIX) and _ENGINE_MADE.fullmatch(command_id) is not None


class CommandScope:
    """The id, time and actor of the command now running on an aggregate."""

    __slots__ = ("actor", "command_id", "now")

    def __init__(self, command_id: str, now: datetime, actor: str | None = None) -> None:
        self.command_id = command_id
        self.now = now
        self.actor = actor


class FlowledgerAggregate(Aggregate):
    """An event-sourced aggregate whose events carry the command id and a monotonic stamp."""

    def begin(self, command_id: str, now: datetime, actor: str | None = None) -> None:
        """Open a command: events triggered until ``end()`` carry ``command_id``, ``now`` and
        ``actor`` (who asked for it, e.g. an API key's id; omitted when None)."""
        # Removed again by end(): a snapshot copies vars(aggregate), and must never carry
        # a command's scope.
        self.__dict__["_command"] = CommandScope(command_id, now, actor)

    def end(self) -> None:
        """Close the command opened by ``begin`` (a no-op when none is open)."""
        self.__dict__.pop("_command", None)

    def tag_creation(self, command_id: str, now: datetime, actor: str | None = None) -> None:
        """Give a just-created aggregate's first event the command's id and time.

        Creation runs through the library's metaclass, before there is an aggregate to
        ``begin`` on; the store calls this right after, before the event is saved.
        """
        first = self.pending_events[0]
        object.__setattr__(first, "timestamp", now)
        object.__setattr__(first, "command_id", command_id)
        if actor is not None:
            object.__setattr__(first, "actor", actor)
        self._created_on = now
        self._modified_on = now

    def trigger_event(self, event_class: Any, **kwargs: Any) -> None:
        """As the library's, stamped and tagged by the open command (if any)."""
        scope: CommandScope | None = self.__dict__.get("_command")
        if scope is None:
            super().trigger_event(event_class, **kwargs)
            return
        if kwargs.get("timestamp") is None:
            last = self.__dict__.get("_modified_on")
            kwargs["timestamp"] = scope.now if last is None or scope.now >= last else last
        super().trigger_event(event_class, **kwargs)
        event = self.pending_events[-1]
        object.__setattr__(event, "command_id", scope.command_id)
        if scope.actor is not None:
            object.__setattr__(event, "actor", scope.actor)


def actor_of(event: Any) -> str | None:
    """Who asked for the command that wrote an event (an API key's id, say), when recorded."""
    value = getattr(event, "actor", None)
    return value if isinstance(value, str) else None


def command_of(event: Any, aggregate: FlowledgerAggregate) -> str | None:
    """The id of the command an event is applied for, inside its ``apply``: the one it was
    stored with on a replay, else (applied as it is triggered, before ``trigger_event`` tags
    it) the command open on ``aggregate``; None for old events and for no open command."""
    stored = command_id_of(event)
    if stored is not None:
        return stored
    scope: CommandScope | None = aggregate.__dict__.get("_command")
    return None if scope is None else scope.command_id


def command_id_of(event: Any) -> str | None:
    """The id of the command that triggered a stored or pending event (None for old events)."""
    value = getattr(event, "command_id", None)
    return value if isinstance(value, str) else None
