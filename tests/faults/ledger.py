"""Counting steps from outside: what writers were told against what the events table holds.

Every step a fault test records carries a unique input marker ``{"s": session, "n": call}``,
so a stored step is matched to its call without the engine's help.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from flowledger.infrastructure import Engine, Settings

EVENTS_TABLE = "flowledger_events"
Marker = tuple[str, str]


@dataclass(frozen=True)
class Tally:
    """Acknowledged calls, stored steps, acknowledged-but-missing, stored more than once."""

    acknowledged: int
    stored: int
    lost: int
    doubled: int
    errors: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"acknowledged={self.acknowledged} stored={self.stored} lost={self.lost} "
            f"doubled={self.doubled} failed_calls: {errors}"
        )


def stored_markers(database_url: str, schema: str) -> Counter[Marker]:
    """How many StepProcessed events the table holds per input marker."""
    query = sql.SQL(
        "SELECT convert_from(state, 'UTF8')::jsonb -> 'input' FROM {}.{} WHERE topic LIKE %s"
    ).format(sql.Identifier(schema), sql.Identifier(EVENTS_TABLE))
    counts: Counter[Marker] = Counter()
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        for (payload,) in conn.execute(query, ("%Session.StepProcessed",)):
            if isinstance(payload, dict) and "s" in payload and "n" in payload:
                counts[(str(payload["s"]), str(payload["n"]))] += 1
    return counts


def tally(
    database_url: str, schema: str, acknowledged: Iterable[Marker], errors: Counter[str] | None = None
) -> Tally:
    """Compare the acknowledged markers with the stored ones."""
    acked = set(acknowledged)
    stored = stored_markers(database_url, schema)
    return Tally(
        acknowledged=len(acked),
        stored=sum(stored.values()),
        lost=sum(1 for marker in acked if stored[marker] == 0),
        doubled=sum(1 for count in stored.values() if count > 1),
        errors=dict(errors or {}),
    )


class WriterLoad:
    """Threads recording steps without idempotency keys until told to stop or out of calls.

    A call that returned is acknowledged; a call that raised is not (it may or may not be
    stored) and the writer goes on with its next call.
    """

    def __init__(
        self, engine: Engine, sessions: list[str], *, threads: int, calls_per_thread: int, pace_s: float = 0.0
    ) -> None:
        self.engine = engine
        self.pace_s = pace_s
        self.sessions = sessions
        self.calls_per_thread = calls_per_thread
        self.acknowledged: list[Marker] = []
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(i,), daemon=True, name=f"writer-{i}")
            for i in range(threads)
        ]

    def start(self) -> WriterLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ask the writers to stop and wait for them (bounded)."""
        self._stop.set()
        self.join(timeout_s)

    def join(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TimeoutError(f"writers still running after {timeout_s}s: {alive}")

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.acknowledged)

    def wait_for(self, acknowledged: int, timeout_s: float) -> bool:
        """Wait until at least ``acknowledged`` calls were acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.count < acknowledged:
            if time.monotonic() > deadline or not any(t.is_alive() for t in self._threads):
                return self.count >= acknowledged
            time.sleep(0.02)
        return True

    def _write(self, index: int) -> None:
        session = self.sessions[index % len(self.sessions)]
        for call in range(self.calls_per_thread):
            if self._stop.is_set():
                return
            marker = (session, f"{index}-{call}")
            try:
                self.engine.record_step(
                    session, "answer", input={"s": marker[0], "n": marker[1]}, output={"ok": True}
                )
            except Exception as error:  # counted, never retried: a raised call is not acknowledged
                with self._lock:
                    self.errors[type(error).__name__] += 1
                time.sleep(0.01)
                continue
            with self._lock:
                self.acknowledged.append(marker)
            if self.pace_s:
                time.sleep(self.pace_s)


def call_within(seconds: float, function: Callable[[], object]) -> tuple[bool, object]:
    """Run ``function`` on a daemon thread; (finished, result or raised error)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(function())
        except BaseException as error:  # handed to the caller
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True, name="bounded-call")
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), outcome[0] if outcome else None)


def fault_settings(database_url: str, schema: str = "faults", **overrides: object) -> Settings:
    """Settings for a fault case: short deadlines, nothing from the developer's environment."""
    base = Settings(
        home=Path("/nonexistent"),
        database_url=database_url,
        schema=schema,
        connect_timeout_s=2.0,
        pool_timeout_s=3.0,
        statement_timeout_s=5.0,
        operation_deadline_s=8.0,
    )
    return base.with_overrides(**overrides)


@contextmanager
def engine_after_an_outage(server: Any, deadline_s: float) -> Iterator[Engine]:
    """An engine on ``server`` (a ``PrivateServer``) with ``deadline_s`` as its operation deadline,
    that has started session "s" (its store read once), then the server stopped."""
    with Engine(settings=fault_settings(server.url, operation_deadline_s=deadline_s)) as engine:
        engine.start_session("s", "wf")
        server.stop()
        yield engine
