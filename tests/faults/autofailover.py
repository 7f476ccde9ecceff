"""A pg_auto_failover formation of the test's own: a monitor, a primary and a synchronous standby.

Debian's ``pg_autoctl`` (pg-auto-failover-cli, postgresql-15-auto-failover) on loopback ports
in a temporary directory, as the ``postgres`` user under root, each keeper under ``timeout``
(SIGTERM, on which it stops its PostgreSQL) so that everything ends by itself. The monitor's
health checks are tightened so that a dead primary is noticed within seconds, not the
default 20-30 s. pg_auto_failover replicates synchronously by default
(``synchronous_standby_names = 'ANY 1 (…)'`` once the standby is in sync).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import psycopg
import pytest

from tests.faults.server import free_port
from tests.support.debian import in_ci, install_in_ci

PG_BIN = Path("/usr/lib/postgresql/15/bin")
LIFETIME_S = 300
"""Each keeper gets SIGTERM after this long whatever happens to the test (SIGKILL 10 s later)."""
_MONITOR_SETTINGS = {
    # Defaults: a check every 5 s, 2 retries 2 s apart, unhealthy after 20 s, demote after 30 s.
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "2000",
    "pgautofailover.primary_demote_timeout": "3000",
}


def require_pg_autoctl() -> Path:
    """``pg_autoctl``; absent, the test is skipped, except under CI=true where that is a failure."""
    extension = Path("/usr/lib/postgresql/15/lib/pgautofailover.so")

    def present() -> bool:
        return bool(shutil.which("pg_autoctl")) and extension.exists() and (PG_BIN / "pg_ctl").exists()

    if install_in_ci(["pg-auto-failover-cli", "postgresql-15-auto-failover"], present):
        return Path(shutil.which("pg_autoctl") or "pg_autoctl")
    why = "pg_autoctl with PostgreSQL 15 is not installed (pg-auto-failover-cli, postgresql-15-auto-failover)"
    if in_ci():
        pytest.fail(f"{why}: CI must run this test")
    pytest.skip(why)


class Formation:
    """``start`` a monitor and two nodes; ``kill_node`` one as a crash would; ``cleanup``."""

    def __init__(self, root: Path) -> None:
        self.autoctl = require_pg_autoctl()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        self._as_root = os.geteuid() == 0
        if self._as_root:
            owner = pwd.getpwnam("postgres")
            os.chown(root, owner.pw_uid, owner.pw_gid)
        self.monitor_port = free_port()
        self.ports = {1: free_port(), 2: free_port()}
        self._keepers: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def monitor_url(self) -> str:
        """The monitor's database, for the nodes to register with."""
        return f"postgresql://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=disable"

    def node_url(self, node: int) -> str:
        """One node's ``postgres`` database, directly."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.ports[node]}/postgres?sslmode=disable&connect_timeout=2"
        )

    @property
    def url(self) -> str:
        """The formation's URL: both nodes, libpq picks the one that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports.values())
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&sslmode=disable&connect_timeout=2"

    def start(self, timeout_s: float = 60.0) -> None:
        """Monitor first (tightened), then node 1 (primary), then node 2 (its standby, in sync)."""
        common = ["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", str(PG_BIN / "pg_ctl")]
        monitor = self.root / "monitor"
        self._run(
            ["create", "monitor", "--pgdata", str(monitor), "--pgport", str(self.monitor_port), *common]
        )
        # The monitor's keeper starts PostgreSQL with ``-h`` from its own configuration (``*``).
        self._run(["config", "set", "--pgdata", str(monitor), "postgresql.listen_addresses", "127.0.0.1"])
        with (monitor / "postgresql.conf").open("a") as conf:
            for key, value in _MONITOR_SETTINGS.items():
                conf.write(f"{key} = {value}\n")
        self._keepers["monitor"] = self._spawn(["run", "--pgdata", str(monitor)])
        _wait_for(lambda: _query(self.monitor_url, "SELECT 1") is not None, "the monitor", timeout_s)
        for node, port in self.ports.items():
            self._keepers[f"node{node}"] = self._spawn(
                [
                    *("create", "postgres", "--pgdata", str(self.root / f"node{node}")),
                    *("--pgport", str(port), "--listen", "127.0.0.1", "--name", f"node{node}"),
                    *("--monitor", self.monitor_url, "--run", *common),
                ]
            )
            # Alone, the first node is "single"; it becomes "primary" once the second is "secondary".
            wanted = "single" if node == 1 else "secondary"
            _wait_for(lambda n=node, w=wanted: self.state(n) == (w, w), f"node {node} {wanted}", timeout_s)
        _wait_for(lambda: self.state(1) == ("primary", "primary"), "node 1 primary", timeout_s)
        # In sync: the primary waits for the standby's flush on every commit.
        _wait_for(
            lambda: _query(self.node_url(1), "SELECT sync_state FROM pg_stat_replication") == "quorum",
            "synchronous replication",
            timeout_s,
        )

    def state(self, node: int) -> tuple[str, str] | None:
        """(reported, assigned) state of a node, as the monitor sees it."""
        row = _query_row(
            self.monitor_url.replace("autoctl_node@", "postgres@"),
            "SELECT reportedstate::text, goalstate::text FROM pgautofailover.node WHERE nodename = %s",
            (f"node{node}",),
        )
        return None if row is None else (str(row[0]), str(row[1]))

    def is_primary(self, node: int) -> bool:
        """Whether the node accepts writes now (promoted, and no longer read-only: pg_auto_failover
        keeps a promoted standby read-only until the old primary is demoted or timed out)."""
        statement = "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"
        return _query(self.node_url(node), statement) is True

    def kill_node(self, node: int) -> None:
        """SIGKILL the node's keeper and its PostgreSQL, as a machine's crash would."""
        keeper = self._keepers.pop(f"node{node}")
        _kill_tree(keeper.pid)
        keeper.wait(timeout=10)

    def cleanup(self) -> None:
        """Stop every keeper (SIGTERM: each stops its PostgreSQL), kill what is left, remove files."""
        for keeper in self._keepers.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                for process in psutil.Process(keeper.pid).children(recursive=True):
                    if process.name() == "pg_autoctl":
                        process.send_signal(signal.SIGTERM)
        for keeper in self._keepers.values():
            try:
                keeper.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill_tree(keeper.pid)
        for process in psutil.process_iter(["cmdline"]):
            # A PostgreSQL of ours whose keeper died first.
            with contextlib.suppress(psutil.Error):
                if any(str(self.root) in part for part in process.info["cmdline"] or []):
                    process.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------

    def _command(self, args: list[str]) -> list[str]:
        env = [
            f"XDG_CONFIG_HOME={self.root / 'config'}",
            f"XDG_DATA_HOME={self.root / 'share'}",
            f"XDG_RUNTIME_DIR={self.root / 'run'}",
            f"PG_CONFIG={PG_BIN / 'pg_config'}",
            f"PATH={PG_BIN}:/usr/bin:/bin",
        ]
        command = ["env", *env, "timeout", "-k", "10", str(LIFETIME_S), str(self.autoctl), *args]
        return ["runuser", "-u", "postgres", "--", *command] if self._as_root else command

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(
            self._command(args), capture_output=True, text=True, timeout=60, check=False, cwd=self.root
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {args[:2]} failed ({done.returncode}): {done.stderr[-2000:]}")

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        # Closed here once the child has its copy of the descriptor.
        with (self.root / f"{args[0]}-{len(self._keepers)}.log").open("wb") as log:
            return subprocess.Popen(
                self._command(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(pid)
        processes = [parent, *parent.children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)


def _query_row(url: str, statement: str, params: tuple[object, ...] = ()) -> tuple[object, ...] | None:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            return conn.execute(statement, params).fetchone()
    except psycopg.Error:
        return None


def _query(url: str, statement: str) -> object:
    row = _query_row(url, statement)
    return None if row is None else row[0]


def _wait_for(condition: object, what: str, timeout_s: float) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)
