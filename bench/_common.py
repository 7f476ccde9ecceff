"""Helpers shared by the benchmarks: which database, a scratch schema, a timed writer pool."""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import psycopg
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.embedded import embedded_database_url

LOCAL = "postgresql://postgres@127.0.0.1:5432/test"

# One customer-service step, as the step benchmarks record it.
INPUT = {"query": "Where is my order #12345? It was due yesterday.", "channel": "web"}
OUTPUT = {"intent": "order_status", "reply": "Your order shipped this morning; it arrives tomorrow."}
USAGE = LlmUsage(
    provider="deepseek",
    request_model="deepseek-v3.2",
    response_model="deepseek-v3.2",
    input_tokens=412,
    output_tokens=58,
    finish_reasons=("stop",),
    response_id="r-1",
    cost_usd=Decimal("0.000197"),
    price_version="2025-01",
    latency_ms=812.0,
)


def database_url() -> str:
    """FLOWLEDGER_DATABASE_URL, else the local server, else an embedded one."""
    configured = os.environ.get("FLOWLEDGER_DATABASE_URL")
    if configured:
        return configured
    try:
        with psycopg.connect(LOCAL, connect_timeout=3):
            return LOCAL
    except psycopg.OperationalError:
        return embedded_database_url(Path(tempfile.mkdtemp(prefix="flowledger-bench-")))


@contextmanager
def scratch_schema(url: str, prefix: str) -> Iterator[str]:
    """A new schema, dropped (with everything in it) afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def run_writers(
    writers: int, seconds: float, make_writer: Callable[[int], Callable[[], None]], *, warmup: float = 0.0
) -> float:
    """Operations per second of ``writers`` threads, each calling its own op for ``seconds``.

    ``make_writer(i)`` prepares writer ``i`` (untimed) and returns the op to repeat.
    With ``warmup``, every writer first repeats its op that long, untimed, and all wait
    for each other before the timed part. All writers start the timed part together; the
    clock stops when the last one stops.
    """
    ops = [make_writer(i) for i in range(writers)]
    counts = [0] * writers
    errors: list[BaseException] = []
    warmed = threading.Barrier(writers + 1)
    start = threading.Barrier(writers + 1)
    stop_at = [0.0]
    warm_until = time.perf_counter() + warmup

    def loop(i: int) -> None:
        op = ops[i]
        try:
            while time.perf_counter() < warm_until:
                op()
        except BaseException as exc:
            errors.append(exc)
        warmed.wait()
        start.wait()
        n = 0
        try:
            while not errors and time.perf_counter() < stop_at[0]:
                op()
                n += 1
        except BaseException as exc:
            errors.append(exc)
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    warmed.wait()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def median(values: list[float]) -> float:
    """The median, for rounds taken on a shared, noisy machine."""
    return statistics.median(values)


SESSION_STEPS = 25
"""Steps per session in the Engine benches: a conversation's length, then a fresh session."""


def engine_writers(engine: Engine) -> Callable[[int], Callable[[], None]]:
    """``run_writers``' writer factory for ``Engine.record_step``: each writer on sessions of its
    own, a new one every ``SESSION_STEPS`` steps (that start is one more commit, not a step)."""

    def make(i: int) -> Callable[[], None]:
        current = [f"bench-{i}-{uuid.uuid4().hex}", 0]
        engine.start_session(str(current[0]), "customer_service")

        def step() -> None:
            if current[1] == SESSION_STEPS:
                current[:] = [f"bench-{i}-{uuid.uuid4().hex}", 0]
                engine.start_session(str(current[0]), "customer_service")
            engine.record_step(str(current[0]), "answer", input=INPUT, output=OUTPUT, usage=USAGE)
            current[1] = int(current[1]) + 1

        return step

    return make
