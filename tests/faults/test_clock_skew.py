"""A writer whose host clock is 5 minutes fast: one clock per stream, expiry judged by it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from flowledger.domain.errors import SessionNotFound
from flowledger.infrastructure import Engine
from tests.faults.ledger import Marker, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
FAST_HOST = Path(__file__).with_name("fast_host_process.py")
SESSION = "skewed"


def record_on_fast_host(url: str, n: str) -> str:
    done = subprocess.run(
        [sys.executable, str(FAST_HOST), url, "faults", SESSION, n],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def version_as_of(engine: Engine, moment: datetime) -> int:
    try:
        return engine.get_session(SESSION, as_of=moment).version
    except SessionNotFound:
        return 0


def longest_prefix_at(stamps: list[datetime], moment: datetime) -> int:
    """How many of the first events were all stamped at or before ``moment``."""
    length = 0
    while length < len(stamps) and stamps[length] <= moment:
        length += 1
    return length


def test_h_a_host_clock_5_minutes_fast_neither_expires_a_session_nor_reorders_its_stream(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given a 3-minute session started and written by an engine on a correct host
    server = private_postgres()
    acknowledged: list[Marker] = []
    engine = Engine(settings=fault_settings(server.url))
    try:
        engine.start_session(SESSION, "customer_service", ttl=timedelta(minutes=3))
        engine.record_step(SESSION, "answer", input={"s": SESSION, "n": "0"})
        acknowledged.append((SESSION, "0"))

        # When a process on a host 5 minutes fast writes to it, then the correct host again
        fast_reply = record_on_fast_host(server.url, "1")
        if fast_reply == "ok":
            acknowledged.append((SESSION, "1"))
        later_reply = "ok"
        try:
            engine.record_step(SESSION, "answer", input={"s": SESSION, "n": "2"})
            acknowledged.append((SESSION, "2"))
        except Exception as error:  # reported below
            later_reply = f"{type(error).__name__}: {error}"
        state = engine.get_session(SESSION)
        history = engine.history(SESSION)
        stamps = [entry.timestamp for entry in history]
        # as_of: the longest prefix of the stream stamped at or before the moment
        as_of_versions = [version_as_of(engine, stamp) for stamp in stamps]
        longest_prefixes = [longest_prefix_at(stamps, stamp) for stamp in stamps]
    finally:
        engine.close()

    result = tally(server.url, "faults", acknowledged)
    kinds = [entry.event_type.rsplit(".", 1)[-1] for entry in history]
    spread = (max(stamps) - min(stamps)).total_seconds()
    report(
        f"{result.line()} fast_host={fast_reply!r} correct_host_after={later_reply!r} "
        f"events={kinds} stamp_spread_s={spread:.1f}"
    )
    # Then the session is still open for everyone, and its stream's stamps never go back
    assert fast_reply == "ok"
    assert later_reply == "ok"
    assert "Expired" not in kinds
    assert state.step_count == 3
    assert stamps == sorted(stamps)
    assert spread < 60, "a stamp came from the fast host's clock"
    assert as_of_versions == longest_prefixes
    assert result.lost == 0
    assert result.doubled == 0
