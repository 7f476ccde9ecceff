"""Several flowledger processes on one PostgreSQL schema: ``serve`` processes, ``projections
follow`` processes and the LLM simulator, each a real subprocess on a loopback port.

Shared by the multi-process test (``tests/e2e/test_multi_process.py``) and the soak
(``tests/support/soak.py``, ``make soak``). Every process is stopped by ``Cluster.stop``
(SIGTERM, then SIGKILL after a grace period), which the context manager runs in ``finally``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from flowledger.infrastructure import Settings

WRITER = "default-writer-" + "7c1e9a4b2d6f8e0a3c5b7d9f1e2a"
READER = "default-reader-" + "4e6a8c0b2d4f6a8c0e2b4d6f8a1c"
START_TIMEOUT_S = 90.0
"""How long a process may take to answer after it was started: the machine is shared."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bearer(secret: str) -> dict[str, str]:
    """The header that carries an API key."""
    return {"Authorization": f"Bearer {secret}"}


@dataclass(frozen=True)
class Faults:
    """The simulator's fault rates and latency (``flowledger simulate-llm`` options)."""

    rate_limited: float = 0.0
    server_error: float = 0.0
    unavailable: float = 0.0
    malformed: float = 0.0
    latency_ms: float | None = None

    def options(self) -> list[str]:
        """The command-line options that set them."""
        rates = [
            ("--rate-limited", self.rate_limited),
            ("--server-error", self.server_error),
            ("--unavailable", self.unavailable),
            ("--malformed", self.malformed),
        ]
        options = [item for name, rate in rates for item in (name, str(rate))]
        if self.latency_ms is not None:
            options += ["--latency-ms", str(self.latency_ms)]
        return options


@dataclass
class Service:
    """One subprocess: how to start it, when it counts as ready, its log file."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[Service], bool]
    url: str = ""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0
    offset: int = 0
    """Where the current start's output begins in the log."""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it and wait until it is ready; RuntimeError with its log if it exits or stalls."""
        self.starts += 1
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as output:
            output.write(f"--- start {self.starts} ---\n")
            output.flush()
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while not self.ready(self):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} was not ready within {timeout_s:.0f} s: {self.tail()}")
            time.sleep(0.2)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace_s``."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    @property
    def pid(self) -> int | None:
        """The running process's id, or None."""
        return None if self.process is None or self.process.poll() is not None else self.process.pid

    def rss_mb(self) -> float | None:
        """Resident memory of the running process in MiB (``/proc``), or None."""
        pid = self.pid
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def this_start(self) -> str:
        """What the current start has written to the log so far."""
        try:
            with self.log.open("rb") as log:
                log.seek(self.offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, characters: int = 3000) -> str:
        """The end of its log."""
        try:
            return self.log.read_text(errors="replace")[-characters:]
        except OSError:
            return "(no log)"


def _answers(path: str, headers: dict[str, str] | None = None) -> Callable[[Service], bool]:
    def ready(service: Service) -> bool:
        try:
            return httpx.get(service.url + path, headers=headers, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def _logged(text: str) -> Callable[[Service], bool]:
    def ready(service: Service) -> bool:
        return text in service.this_start()

    return ready


def _both(first: Callable[[Service], bool], then: Callable[[Service], bool]) -> Callable[[Service], bool]:
    return lambda service: first(service) and then(service)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowledger.adapters.cli.main", *args]


@dataclass
class Cluster:
    """A simulator, ``servers`` processes of ``flowledger serve`` and ``followers`` of
    ``projections follow``, on ``schema`` of ``database_url``; logs under ``workdir``."""

    database_url: str
    schema: str
    workdir: Path
    servers: int = 3
    followers: int = 2
    faults: Faults = field(default_factory=Faults)
    read_database_url: str | None = None
    """``FLOWLEDGER_READ_DATABASE_URL`` of the servers: set, their dashboards read the projections
    as the followers keep them, without catching up themselves."""
    simulator: Service | None = None
    serving: list[Service] = field(default_factory=list)
    following: list[Service] = field(default_factory=list)
    _ports: set[int] = field(default_factory=set, repr=False)
    chain_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    signing_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def processes(self) -> list[Service]:
        """Every process, simulator first."""
        return [s for s in [self.simulator, *self.serving, *self.following] if s is not None]

    @property
    def urls(self) -> list[str]:
        """The servers' base URLs, in order."""
        return [s.url for s in self.serving]

    def settings(self) -> Settings:
        """Settings for an engine of the test's own on the same log (same tenant and keys)."""
        return Settings(
            home=self.workdir,
            database_url=self.database_url,
            schema=self.schema,
            chain_key=self.chain_key,
            signing_key=self.signing_key,
            connect_timeout_s=20.0,
            operation_deadline_s=60.0,
        )

    def env(self, llm_base_url: str) -> dict[str, str]:
        """The environment of a flowledger process: nothing of the caller's FLOWLEDGER_* settings."""
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_")},
            "FLOWLEDGER_DATABASE_URL": self.database_url,
            "FLOWLEDGER_SCHEMA": self.schema,
            "FLOWLEDGER_HOME": str(self.workdir),
            "FLOWLEDGER_LLM_BASE_URL": llm_base_url,
            "FLOWLEDGER_LLM_API_KEY": "sk-simulator-0000000",
            "FLOWLEDGER_API_KEYS": f"default:writer:{WRITER},default:reader:{READER}",
            "FLOWLEDGER_CHAIN_KEY": self.chain_key.hex(),
            "FLOWLEDGER_SIGNING_KEY": self.signing_key.hex(),
            # One load generator speaks for many callers: the per-key rate limit is not under test.
            "FLOWLEDGER_HTTP_RATE_PER_S": "1000000",
            "FLOWLEDGER_HTTP_RATE_BURST": "1000000",
            # Generous deadlines: the database and the cores are shared with other work.
            "FLOWLEDGER_CONNECT_TIMEOUT_S": "20",
            "FLOWLEDGER_OPERATION_DEADLINE_S": "60",
        }
        if self.read_database_url is not None:
            env["FLOWLEDGER_READ_DATABASE_URL"] = self.read_database_url
        return env

    def start(self) -> None:
        """Start the simulator, then the servers (the first alone: it creates the schema), then
        the followers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.simulator = self._listening(
            "simulator",
            lambda port: (
                _cli("simulate-llm", "--port", str(port), "--seed", "17", "--retry-after", "0.05")
                + self.faults.options()
            ),
            {k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_")},
            "LLM simulator listening on {url}/v1",
            _answers("/v1/models", bearer("sk-simulator-0000000")),
        )
        env = self.env(self.simulator.url + "/v1")
        for index in range(self.servers):
            self.serving.append(
                self._listening(
                    f"server-{index}",
                    lambda port: _cli("serve", "--port", str(port), "--no-access-log"),
                    env,
                    "Uvicorn running on {url}",
                    _answers("/readyz"),
                )
            )
        for index in range(self.followers):
            log = self.workdir / f"follower-{index}.log"
            follower = Service(
                f"follower-{index}", _cli("projections", "follow"), env, log, _logged("following the log")
            )
            self.following.append(follower)
            follower.start()

    def _listening(
        self,
        name: str,
        command: Callable[[int], list[str]],
        env: dict[str, str],
        listening: str,
        answers: Callable[[Service], bool],
    ) -> Service:
        """Start a process that listens on a port of its own, ready once its log says it listens
        there (so a server of someone else's on that port never passes for it) and it answers;
        another port when the chosen one was taken meanwhile."""
        for _ in range(3):
            port = free_port()
            while port in self._ports:
                port = free_port()
            self._ports.add(port)
            url = f"http://127.0.0.1:{port}"
            ready = _both(_logged(listening.format(url=url)), answers)
            service = Service(name, command(port), env, self.workdir / f"{name}.log", ready, url)
            try:
                service.start()
            except RuntimeError:
                if "address already in use" not in service.this_start():
                    raise
                continue
            return service
        raise RuntimeError(f"{name}: three ports were taken before it could listen")

    def run_cli(self, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``flowledger *args`` on the cluster's schema, as a one-off process (output captured)."""
        base = self.simulator.url + "/v1" if self.simulator is not None else ""
        return subprocess.run(
            _cli(*args), env=self.env(base), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def restart(self, server: int) -> float:
        """Stop server ``server`` (SIGTERM) and start it again on its port; seconds it was away."""
        began = time.monotonic()
        self.serving[server].stop()
        self.serving[server].start()
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop every process, followers first, simulator last."""
        for service in reversed(self.processes):
            service.stop()

    def rss_mb(self) -> dict[str, float | None]:
        """Each process's resident memory now (MiB)."""
        return {service.name: service.rss_mb() for service in self.processes}


@contextmanager
def running_cluster(
    database_url: str,
    schema: str,
    workdir: Path,
    *,
    servers: int = 3,
    followers: int = 2,
    faults: Faults | None = None,
    read_database_url: str | None = None,
) -> Iterator[Cluster]:
    """A started ``Cluster``; every process is stopped afterwards, whatever happened."""
    cluster = Cluster(
        database_url, schema, workdir, servers, followers, faults or Faults(), read_database_url
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
