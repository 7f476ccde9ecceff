"""A PgBouncer of the test's own, in transaction-pooling mode (or another ``pool_mode``), in
front of a private cluster.

Debian's ``pgbouncer`` on a free loopback port with a generated ini (trust auth, an auth
file naming ``postgres``), run as the ``postgres`` user under root (it refuses to run as
root) and under ``timeout`` so that it ends by itself even if the test process dies.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.faults.server import PrivateServer, free_port
from tests.support.debian import in_ci, install_in_ci

BINARY = Path("/usr/sbin/pgbouncer")
LIFETIME_S = 300
"""PgBouncer is killed after this long whatever happens to the test."""


def require_pgbouncer() -> Path:
    """The binary; absent, the test is skipped, except under CI=true where that is a failure."""

    def found() -> str | None:
        return str(BINARY) if BINARY.exists() else shutil.which("pgbouncer")

    if install_in_ci(["pgbouncer"], lambda: found() is not None):
        return Path(found() or BINARY)
    if in_ci():
        pytest.fail("pgbouncer is not installed (Debian package pgbouncer): CI must run this test")
    pytest.skip("pgbouncer is not installed (Debian package pgbouncer)")


class PgBouncer:
    """``start`` / ``stop`` one PgBouncer; ``url(database)`` reaches ``server`` through it."""

    def __init__(
        self, server: PrivateServer, root: Path, *, pool_size: int = 4, pool_mode: str = "transaction"
    ) -> None:
        self.binary = require_pgbouncer()
        self.server = server
        self.root = root
        self.port = free_port()
        self.ini = root / "pgbouncer.ini"
        self.log = root / "pgbouncer.log"
        self._process: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "userlist.txt").write_text('"postgres" ""\n')
        self.ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {root / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            # Few server connections for many clients: every transaction may land on another one.
            f"default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
            "max_client_conn = 500\n"
            f"logfile = {self.log}\npidfile = {root / 'pgbouncer.pid'}\n"
            "admin_users = postgres\n"
        )
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (root, *root.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)

    def url(self, database: str = "postgres") -> str:
        """A libpq URL through PgBouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=disable&connect_timeout=3"

    def start(self) -> None:
        """Start it and wait until it accepts a query."""
        command = ["timeout", "-s", "KILL", str(LIFETIME_S), str(self.binary), "-q", str(self.ini)]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.root,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(self.url(), autocommit=True, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text()[-2000:] if self.log.exists() else ""
                    raise RuntimeError(f"pgbouncer did not start: {log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop it (SIGTERM: at once, dropping clients), and remove its files."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)
