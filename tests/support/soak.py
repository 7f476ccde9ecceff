"""The soak: mixed load on several processes for a while, then an account of what was lost.

Three ``flowledger serve`` and two ``projections follow`` processes on one schema, model calls
through a simulator that answers some requests 429, 500, 503 or with a broken body. Worker
threads of one load generator run sessions (each step delivered twice, to two servers, under
one idempotency key), waves of tasks assigned from two servers, and dashboard and funnel
reads; half-way through a ``projections rebuild`` runs, and at 60 % one server is restarted.
The report gives throughput per server, p50/p99 latency per kind of operation, refusals, the
memory of every process over time, and what the log holds against what was acknowledged
(lost and doubled must be 0). ``make soak`` runs it for 10 minutes (``bench/soak.py``); a
60-second form runs in the test suite (``tests/e2e/test_soak.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flowledger.infrastructure import Engine
from tests.support.cluster import Cluster, Faults, running_cluster
from tests.support.load import Balancer, Latency
from tests.support.store_checks import (
    AgentLoads,
    Tally,
    agent_loads,
    count_by_field,
    projection_differences,
    session_tally,
    step_tally,
    tally,
    task_tally,
    version_gaps,
    wait_for_followers,
)
from tests.support.workload import WORKFLOW, Acks, complete_tasks, register_agents, run_session, task_wave

FAULTY = Faults(rate_limited=0.03, server_error=0.02, unavailable=0.01, malformed=0.01)
"""7 % of model calls fail at the simulator; the servers' client retries them (twice)."""
AGENTS, CAPACITY = 4, 3
SESSION_WORKERS, TASK_WORKERS = 6, 2
TASKS_PER_WAVE = 8
RESTARTED = 2
"""The server restarted mid-run (an assigner: tasks are assigned from servers 1 and 2)."""


@dataclass(frozen=True)
class Sample:
    """Every process's resident memory (MiB) at ``at`` seconds into the run."""

    at: float
    rss_mb: dict[str, float | None]


@dataclass
class SoakReport:
    """What a soak run measured."""

    seconds: float
    requests: list[int]
    throughput: list[float]
    latencies: list[Latency]
    errors: dict[str, int]
    samples: list[Sample]
    tallies: list[Tally]
    loads: AgentLoads
    differences: list[str]
    rebuild: str
    restart: str
    alive: list[str]
    dead: list[str]
    followers_caught_up_s: float
    refusal_samples: dict[str, str] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    """Streams with a version missing (``store_checks.version_gaps``)."""

    @property
    def lost(self) -> int:
        """Acknowledged ids missing from the log, over every kind."""
        return sum(t.lost for t in self.tallies)

    @property
    def doubled(self) -> int:
        """Ids in the log more than once, over every kind."""
        return sum(t.doubled for t in self.tallies)

    def print(self, console: Console) -> None:
        """The report as tables."""
        console.print(f"soak: {self.seconds:.0f} s of load; {self.rebuild}; {self.restart}")
        servers = Table(title="throughput per server (responses, any status)")
        for column in ("server", "requests", "requests/s"):
            servers.add_column(column, justify="right")
        for index, (count, rate) in enumerate(zip(self.requests, self.throughput, strict=True)):
            servers.add_row(f"server-{index}", f"{count:,}", f"{rate:.1f}")
        servers.add_row("all", f"{sum(self.requests):,}", f"{sum(self.throughput):.1f}")
        console.print(servers)
        kinds = Table(title="latency per operation (answered requests, ms)")
        for column in ("operation", "count", "p50", "p99", "max"):
            kinds.add_column(column, justify="left" if column == "operation" else "right")
        for row in self.latencies:
            kinds.add_row(
                row.kind, f"{row.count:,}", f"{row.p50_ms:.0f}", f"{row.p99_ms:.0f}", f"{row.max_ms:.0f}"
            )
        console.print(kinds)
        refusals = Table(title="refused or failed attempts (retried by the load generator)")
        refusals.add_column("operation and status")
        refusals.add_column("count", justify="right")
        refusals.add_column("first answer", overflow="fold")
        for what, count in sorted(self.errors.items()):
            refusals.add_row(what, str(count), self.refusal_samples.get(what, "")[:120])
        console.print(refusals if self.errors else "refused or failed attempts: none")
        console.print(self._memory_table())
        console.print("lost and doubled against what the load generator was acknowledged:")
        for line in self.tallies:
            console.print("  " + line.line(), highlight=False)
        peaks = ", ".join(
            f"{a} {self.loads.peak.get(a, 0)}/{c}" for a, c in sorted(self.loads.capacity.items())
        )
        console.print(
            f"agents' peak load / capacity: {peaks}; over capacity: {self.loads.overloaded or 'none'}"
        )
        console.print(f"streams with a version missing: {self.gaps[:5] or 'none'}", highlight=False)
        console.print(
            f"followers at the head {self.followers_caught_up_s:.1f} s after the load stopped; projections"
            f" against a rebuild: {'equal' if not self.differences else self.differences[:5]}"
        )
        console.print(
            f"LOST {self.lost} DOUBLED {self.doubled}; processes down at the end: {self.dead or 'none'}"
        )

    def _memory_table(self) -> Table:
        table = Table(title="resident memory over time (MiB)")
        picked = _spread(self.samples, 8)
        table.add_column("process")
        for sample in picked:
            table.add_column(f"{sample.at:.0f} s", justify="right")
        table.add_column("peak", justify="right")
        names = list(self.samples[0].rss_mb) if self.samples else []
        for name in names:
            values = [s.rss_mb.get(name) for s in self.samples]
            peak = max((v for v in values if v is not None), default=None)
            cells = [_mb(s.rss_mb.get(name)) for s in picked]
            table.add_row(name, *cells, _mb(peak))
        return table


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _spread(samples: list[Sample], most: int) -> list[Sample]:
    """At most ``most`` samples, evenly spread, the first and the last included."""
    if len(samples) <= most:
        return samples
    step = (len(samples) - 1) / (most - 1)
    return [samples[round(i * step)] for i in range(most)]


class _Workers:
    """Threads that repeat a job until told to stop."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failures: list[str] = []

    def start(self, name: str, job: Callable[[int], None]) -> None:
        def loop() -> None:
            for turn in itertools.count():
                if self.stop.is_set():
                    return
                try:
                    job(turn)
                except Exception as error:  # reported: a worker's bug must not pass unseen
                    self.failures.append(f"{name}: {type(error).__name__}: {error}")
                    return

        thread = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout_s: float) -> list[str]:
        """Stop and wait; the names of threads still running after ``timeout_s``."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


def _session_job(balancer: Balancer, acks: Acks, worker: int) -> Callable[[int], None]:
    def job(turn: int) -> None:
        session_id = f"soak-{worker}-{turn}"
        run_session(balancer, acks, session_id)
        if session_id in acks.sessions:
            body = {"resolution": {"resolved": True}}
            balancer.deliver("complete_session", "POST", f"/v1/sessions/{session_id}/complete", body)

    return job


def _task_job(balancer: Balancer, acks: Acks, worker: int) -> Callable[[int], None]:
    def job(turn: int) -> None:
        assigned = task_wave(balancer, acks, f"t{worker}-{turn}", TASKS_PER_WAVE, assigners=(1, 2))
        for task_id in assigned:
            balancer.deliver("start_task", "POST", f"/v1/tasks/{task_id}/start")
        complete_tasks(balancer, acks, assigned)

    return job


def _reader_job(balancer: Balancer, stop: threading.Event) -> Callable[[int], None]:
    def job(turn: int) -> None:
        if turn % 2 == 0:
            balancer.deliver("dashboard", "GET", "/v1/dashboard?since=1h&by=model")
        else:
            balancer.deliver("funnel", "GET", f"/v1/funnel/{WORKFLOW}")
        stop.wait(0.5)

    return job


def run_soak(
    database_url: str,
    schema: str,
    workdir: Path,
    seconds: float,
    *,
    console: Console | None = None,
    reads_catch_up: bool = False,
) -> SoakReport:
    """Run the soak for ``seconds`` of load on ``schema`` (logs under ``workdir``); its report.

    The servers' dashboards read what the followers keep current (``FLOWLEDGER_READ_DATABASE_URL``
    set to the database itself); with ``reads_catch_up`` each read catches the projections up
    first, as a server does without that setting.
    """
    out = console or Console(stderr=True)
    reads = None if reads_catch_up else database_url
    with running_cluster(database_url, schema, workdir, faults=FAULTY, read_database_url=reads) as cluster:
        out.print(
            f"soak: {len(cluster.serving)} servers, {len(cluster.following)} followers up; {seconds:.0f} s"
        )
        balancer = Balancer(cluster.urls)
        acks = Acks()
        try:
            register_agents(balancer, AGENTS, CAPACITY)
            report = _drive(cluster, balancer, acks, seconds, out)
        finally:
            balancer.close()
        return report


def _drive(cluster: Cluster, balancer: Balancer, acks: Acks, seconds: float, out: Console) -> SoakReport:
    workers = _Workers()
    for worker in range(SESSION_WORKERS):
        workers.start(f"sessions-{worker}", _session_job(balancer, acks, worker))
    for worker in range(TASK_WORKERS):
        workers.start(f"tasks-{worker}", _task_job(balancer, acks, worker))
    workers.start("reader", _reader_job(balancer, workers.stop))
    began = time.monotonic()
    samples: list[Sample] = []
    every = max(1.0, seconds / 60)
    restart = "not reached"
    rebuild: list[str] = []
    rebuilder = threading.Thread(
        target=lambda: rebuild.append(_rebuild(cluster, out)), name="rebuild", daemon=True
    )
    restarted = False
    try:
        while (elapsed := time.monotonic() - began) < seconds:
            samples.append(Sample(elapsed, cluster.rss_mb()))
            if rebuilder.ident is None and elapsed >= seconds * 0.5:
                rebuilder.start()
            if not restarted and elapsed >= seconds * 0.6:
                restarted = True
                away = cluster.restart(RESTARTED)
                restart = f"server-{RESTARTED} restarted at {elapsed:.0f} s, away {away:.1f} s"
                out.print(restart)
            time.sleep(min(every, max(0.0, seconds - (time.monotonic() - began))))
    finally:
        stuck = workers.join(180)
        if rebuilder.ident is not None:
            rebuilder.join(300)
    elapsed = time.monotonic() - began
    samples.append(Sample(elapsed, cluster.rss_mb()))
    if stuck or workers.failures:
        raise RuntimeError(f"load workers failed {workers.failures} or hung {stuck}")
    out.print(f"soak: load stopped after {elapsed:.0f} s; checking the log")
    with Engine(settings=cluster.settings()) as engine:
        waited = wait_for_followers(engine, timeout_s=120)
        differences = projection_differences(engine)
    url, schema = cluster.database_url, cluster.schema
    releases = count_by_field(url, schema, "Agent.TaskReleased", "task_id")
    return SoakReport(
        seconds=elapsed,
        requests=[balancer.answered[i] for i in range(len(balancer.urls))],
        throughput=balancer.throughput(elapsed),
        latencies=balancer.latencies(),
        errors=dict(balancer.errors),
        refusal_samples=dict(balancer.samples),
        samples=samples,
        tallies=[
            session_tally(url, schema, acks.sessions),
            step_tally(url, schema, acks.steps),
            task_tally(url, schema, acks.tasks),
            tally("task completions", acks.completed, releases),
        ],
        loads=agent_loads(url, schema),
        gaps=version_gaps(url, schema),
        differences=differences,
        rebuild=rebuild[0] if rebuild else "not done",
        restart=restart,
        alive=[s.name for s in cluster.processes if s.pid is not None],
        dead=[s.name for s in cluster.processes if s.pid is None],
        followers_caught_up_s=waited,
    )


def _rebuild(cluster: Cluster, out: Console) -> str:
    """``flowledger projections rebuild`` while the load runs; a line saying how it went."""
    out.print("projections rebuild started")
    began = time.monotonic()
    done = cluster.run_cli("projections", "rebuild")
    took = time.monotonic() - began
    line = f"projections rebuilt in {took:.1f} s under load (exit {done.returncode})"
    out.print(line if done.returncode == 0 else f"{line}: {done.stdout[-500:]} {done.stderr[-500:]}")
    return line


def check_succeeded(report: SoakReport) -> list[str]:
    """What went wrong in a soak run (empty: nothing)."""
    problems = []
    if report.lost or report.doubled:
        problems.append(f"lost {report.lost}, doubled {report.doubled}")
    if report.loads.overloaded:
        problems.append(f"agents over capacity: {report.loads.overload_details}")
    if report.gaps:
        problems.append(f"streams with a version missing: {report.gaps[:5]}")
    if report.differences:
        problems.append(f"projections differ from a rebuild: {report.differences[:5]}")
    if report.dead:
        problems.append(f"processes down: {report.dead}")
    if "exit 0" not in report.rebuild:
        problems.append(f"rebuild: {report.rebuild}")
    if "restarted" not in report.restart:
        problems.append(f"restart: {report.restart}")
    unexpected = {k: v for k, v in report.errors.items() if k.endswith(" 500")}
    if unexpected:
        problems.append(f"unexpected server errors: {unexpected}")
    return problems
