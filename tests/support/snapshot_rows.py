"""Snapshot rows as tests read and edit them: the JSON inside the chain key's seal
(``infrastructure/postgres/snapshot_seal.py``), and an edited one sealed again with the key, as
an engine would have stored it (so that the load itself meets what the edit changed)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal, stripped


def snapshot_json(stored: bytes) -> Any:
    """A stored snapshot's state as JSON, its seal (if any) left out."""
    return json.loads(stripped(StoredEvent(UUID(int=0), 0, "", stored)).state)


def sealed_again(engine: Engine, stream: UUID, version: int, topic: str, payload: Any) -> bytes:
    """``payload`` as a snapshot's stored bytes, sealed with ``engine``'s chain key."""
    stored = StoredEvent(stream, version, topic, json.dumps(payload).encode())
    return SnapshotSeal(engine.audit.chain_key).sealed(stored).state
