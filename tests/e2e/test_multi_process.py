"""Three ``flowledger serve`` processes and two ``projections follow`` processes on one schema,
driven by one load generator: every step recorded once, capacity held, projections equal a
rebuild.

Sessions are spread over the servers; each step goes through the LLM simulator and is
delivered twice at once, to two servers, under one idempotency key; tasks are assigned from
servers 1 and 2 at once (each task sent to both). Only the followers maintain the projections
(nothing here reads the dashboard, which would catch them up itself).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowledger.infrastructure import Engine
from tests.support.cluster import Faults, running_cluster
from tests.support.load import Balancer
from tests.support.store_checks import (
    agent_loads,
    projection_differences,
    session_tally,
    step_tally,
    task_tally,
    wait_for_followers,
)
from tests.support.workload import STEPS, Acks, complete_tasks, register_agents, run_session, task_wave

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(240)]

SESSIONS = 18
AGENTS, CAPACITY = 3, 2
WAVES, TASKS_PER_WAVE = 2, 9


def test_three_servers_and_two_followers_record_every_step_once_and_hold_capacity(
    database_url: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    acks = Acks()
    with running_cluster(database_url, pg_schema, tmp_path, faults=Faults(latency_ms=5)) as cluster:
        balancer = Balancer(cluster.urls)
        try:
            began = time.monotonic()
            # Given agents with 6 slots in all
            register_agents(balancer, AGENTS, CAPACITY)
            # When sessions run on every server while two servers assign waves of tasks
            with ThreadPoolExecutor(max_workers=6) as pool:
                sessions = [pool.submit(run_session, balancer, acks, f"s-{n}") for n in range(SESSIONS)]
                assigned_per_wave = []
                for wave in range(WAVES):
                    assigned = task_wave(balancer, acks, f"w{wave}", TASKS_PER_WAVE, assigners=(1, 2))
                    assigned_per_wave.append(len(assigned))
                    complete_tasks(balancer, acks, assigned)
                for future in sessions:
                    future.result(timeout=180)
            elapsed = time.monotonic() - began
            throughput = balancer.throughput(elapsed)
            errors = dict(balancer.errors)
            samples = dict(balancer.samples)
        finally:
            balancer.close()
        with Engine(settings=cluster.settings()) as engine:
            waited = wait_for_followers(engine)
            differences = projection_differences(engine)
        dead = [s.name for s in cluster.processes if s.pid is None]

    steps = step_tally(database_url, pg_schema, acks.steps)
    loads = agent_loads(database_url, pg_schema)
    with capsys.disabled():
        print(f"\n[multi-process] {elapsed:.1f} s of load, followers at the head {waited:.1f} s after it")
        for index, rate in enumerate(throughput):
            print(
                f"[multi-process] server-{index}: {balancer.answered[index]} requests, {rate:.1f} requests/s"
            )
        print(
            f"[multi-process] {steps.line()}; assigned per wave {assigned_per_wave};"
            f" refusals {errors} {samples}"
        )

    # Then every process lived through it, and every step is in the log exactly once
    assert dead == []
    assert len(acks.sessions) == SESSIONS
    assert len(acks.steps) == SESSIONS * len(STEPS)
    assert (steps.lost, steps.doubled, steps.stored) == (0, 0, SESSIONS * len(STEPS))
    assert acks.answered_twice == SESSIONS * len(STEPS)
    assert acks.mismatched == []
    assert session_tally(database_url, pg_schema, acks.sessions).doubled == 0
    assert task_tally(database_url, pg_schema, acks.tasks).doubled == 0
    # and no agent ever held more tasks than its capacity; each wave filled exactly the free slots
    assert loads.overloaded == []
    assert assigned_per_wave == [AGENTS * CAPACITY] * WAVES
    assert loads.accepted == AGENTS * CAPACITY * WAVES
    assert set(loads.final.values()) == {0}
    assert len(acks.escalated) == WAVES * (TASKS_PER_WAVE - AGENTS * CAPACITY)
    # and the only refusals were duplicates waiting for the step their twin held
    assert set(errors) <= {"process_step 409"}, errors
    # and the followers' projections equal a rebuild from the log
    assert differences == []
    # and every server took a share of the load
    assert all(balancer.answered[i] > 0 for i in range(3))
