"""Debian packages a test needs (Chromium, PgBouncer, pg_auto_failover): installed with
apt-get when missing in CI (``CI=true``) and running as root, once per machine at a time."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``), where such tests must run, never skip."""
    return os.environ.get("CI", "").lower() == "true"


def install_in_ci(packages: Sequence[str], present: Callable[[], bool]) -> bool:
    """Install ``packages`` unless ``present()``; only in CI, as root, with apt-get. Whether
    they are present afterwards (False outside CI when missing: the caller skips or fails)."""
    if present():
        return True
    if not (in_ci() and os.geteuid() == 0 and shutil.which("apt-get")):
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock_path = Path(tempfile.gettempdir()) / f"flowledger-apt-{'-'.join(packages)}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if present():
            return True
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *packages],
            env=env,
            check=False,
            capture_output=True,
            timeout=900,
        )
    return present()
