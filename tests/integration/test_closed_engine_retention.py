"""A closed engine refuses retention's and the audit trail's calls with EngineClosed at once,
as it refuses every other command and read (README: Rules and errors), and writes nothing.

Observed (an outside probe, PostgreSQL): after ``engine.close()``, ``engine.retention``
still set and deleted policies (a row written by a closed engine), listed them and ran
``archive_sessions``, each on a connection of its own; ``engine.audit.checkpoint()`` was a
``StoreUnavailable`` ("pool has already been opened/closed"), an outage a caller waits out.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest

from flowledger.domain.errors import EngineClosed, StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.bundles import export_bundle
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from tests.conftest import make_settings

CALLS: dict[str, Callable[[Engine], Any]] = {
    "retention.set_policy": lambda e: e.retention.set_policy("wf-new", 30),
    "retention.delete_policy": lambda e: e.retention.delete_policy("wf"),
    "retention.policies": lambda e: e.retention.policies(),
    "retention.archived": lambda e: e.retention.archived(),
    "archive_sessions": lambda e: e.archive_sessions(tempfile.mkdtemp()),
    "archive_sessions dry run": lambda e: e.archive_sessions(tempfile.mkdtemp(), dry_run=True),
    "restore_sessions": lambda e: e.restore_sessions("/nonexistent/bundle.jsonl"),
    "audit.checkpoint": lambda e: e.audit.checkpoint(),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("retention_first", [False, True], ids=["fresh", "retention-taken-before-close"])
def test_a_closed_engine_refuses_retention_and_audit_calls_at_once_writing_nothing(
    database_url: str, pg_schema: str, call: Callable[[Engine], Any], retention_first: bool
) -> None:
    # Given a retention policy, and an engine closed (its retention used before or not)
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as setter:
        setter.retention.set_policy("wf", 90)
    engine = Engine(settings=settings)
    if retention_first:
        engine.retention.policies()
    engine.close()
    # When a retention or audit call runs on it
    started = time.monotonic()
    with pytest.raises(EngineClosed) as raised:
        call(engine)
    # Then it is refused at once as a programming error, and the policies are as they were
    assert time.monotonic() - started < 1.0
    assert not isinstance(raised.value, StoreUnavailable)
    with Engine(settings=settings) as reader:
        assert reader.retention.policies() == {"wf": 90}


def test_an_audit_trail_taken_before_its_engine_closed_refuses_a_checkpoint_as_closed(
    pg_engine: Engine,
) -> None:
    # (Its checkpoint met the closed pool and said StoreUnavailable: "pool has already been
    # opened/closed and cannot be reused", an outage to wait out.)
    # Given the engine's audit trail, kept, and the engine closed
    trail = pg_engine.audit
    pg_engine.close()
    # When a checkpoint is taken
    started = time.monotonic()
    with pytest.raises(EngineClosed) as raised:
        trail.checkpoint()
    # Then it is refused at once as a closed engine's call
    assert time.monotonic() - started < 1.0
    assert raised.value.operation == "checkpoint"


TRAIL_CALLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "heads_at": lambda trail, taken, stream: trail.heads_at(taken),
    "anchored": lambda trail, taken, stream: trail.anchored(),
    "checked_bundle": lambda trail, taken, stream: trail.checked_bundle([]),
    "verify_chain of a stream": lambda trail, taken, stream: verify_chain(trail, stream=stream),
    "verify_chain": lambda trail, taken, stream: verify_chain(trail),
    "export_bundle": lambda trail, taken, stream: export_bundle(trail, io.StringIO(), [stream]),
}


@pytest.mark.parametrize("call", TRAIL_CALLS.values(), ids=TRAIL_CALLS.keys())
def test_an_audit_trail_taken_before_its_engine_closed_refuses_every_call_as_closed(
    pg_engine: Engine, call: Callable[[Any, Any, Any], Any]
) -> None:
    # (Only its checkpoint was refused: it went on verifying the log, reading heads and
    # exporting bundles on connections of its own, for an engine that was closed.)
    # Given the engine's audit trail and a checkpoint, kept, and the engine closed
    pg_engine.start_session("s1", "wf")
    trail = pg_engine.audit
    taken = trail.checkpoint()
    stream = pg_engine.session_uuid("s1")
    pg_engine.close()
    # When the trail is used
    started = time.monotonic()
    with pytest.raises(EngineClosed):
        call(trail, taken, stream)
    # Then it is refused at once, as the engine's own calls are
    assert time.monotonic() - started < 1.0
