"""Snapshots sealed under the chain key, so that one edited in the database is not read.

A load starts from an aggregate's latest snapshot, and snapshots are not chained (they are
derived data, taken again and again): a session's total cost edited in its snapshot from
0.0054 to 99.0054 was what ``get_session`` answered until the next ``audit verify`` compared
the snapshot with its events. Each snapshot row now ends with an HMAC-SHA256 under the chain
key (``MacKey``, the events' seal) over its stream, version, topic and state; a read checks it
and strips it. A snapshot whose seal does not check (its bytes, topic, stream or version
changed; or written by an engine without this key, or before snapshots were sealed) does not
read back (``StoredEventUnreadable``), and the load folds the aggregate from its events
(``store.loaded``). Someone who can write to the database but does not hold the key cannot
make an edited snapshot read.

An archived session (docs/retention.md) has no events before its base to fold from: its
snapshot, stored unsealed before this module, is read when it is byte for byte the one its
base seals (the base's own seal is under the same key).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from eventsourcing.persistence import StoredEvent

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.verify import MacKey

MARK: Final = b"\x00flowledger.snapshot-seal.v1:"
"""What precedes the 32-byte HMAC at the end of a sealed snapshot's state (no JSON payload
holds a NUL byte, so an unsealed state never ends with it)."""
_TAG: Final = b"flowledger.snapshot.v1\x00"
_MAC_BYTES: Final = 32
_TRAILER: Final = len(MARK) + _MAC_BYTES
_UNSEALED: Final = "it carries no seal (stored before snapshots were sealed, or without the chain key)"
_BROKEN: Final = "its seal does not match its stream, version, topic and state (changed in the database)"


class SnapshotSeal:
    """Seals snapshot rows before they are stored, and checks and strips them as they are read."""

    __slots__ = ("_key", "key")

    def __init__(self, key: bytes) -> None:
        """``key``: the chain key (``infrastructure/audit_keys.py``)."""
        self.key = key
        self._key = MacKey(key)

    def sealed(self, stored: StoredEvent) -> StoredEvent:
        """``stored`` with its seal appended to its state."""
        state = stored.state + MARK + self._mac(stored, stored.state)
        return StoredEvent(stored.originator_id, stored.originator_version, stored.topic, state)

    def opened(self, stored: StoredEvent) -> StoredEvent:
        """``stored`` without its seal; ``StoredEventUnreadable`` when the seal is missing or
        does not check (``is_sealed`` tells the two apart)."""
        state = stored.state
        if not is_sealed(state):
            raise _unreadable(stored, _UNSEALED)
        body, mac = state[:-_TRAILER], state[-_MAC_BYTES:]
        if not hmac.compare_digest(self._mac(stored, body), mac):
            raise _unreadable(stored, _BROKEN)
        return StoredEvent(stored.originator_id, stored.originator_version, stored.topic, body)

    def _mac(self, stored: StoredEvent, state: bytes) -> bytes:
        topic = stored.topic.encode()
        digest = hashlib.sha256(b"".join((_TAG, len(topic).to_bytes(4, "big"), topic, state))).digest()
        return self._key.mac(str(stored.originator_id), stored.originator_version, digest)


def stripped(stored: StoredEvent) -> StoredEvent:
    """``stored`` without its seal, unchecked (an engine that does not chain, so holds no key,
    still reads the snapshots the others seal)."""
    if not is_sealed(stored.state):
        return stored
    state = stored.state[:-_TRAILER]
    return StoredEvent(stored.originator_id, stored.originator_version, stored.topic, state)


def is_sealed(state: bytes) -> bool:
    """Whether a snapshot's stored state ends with a seal (checked or not)."""
    return len(state) >= _TRAILER and state[-_TRAILER:-_MAC_BYTES] == MARK


def _unreadable(stored: StoredEvent, reason: str) -> StoredEventUnreadable:
    return StoredEventUnreadable(
        str(stored.originator_id), stored.originator_version, stored.topic, f"snapshot: {reason}"
    )
