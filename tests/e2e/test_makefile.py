"""The Makefile on a machine without util-linux's ``flock`` (macOS): ``make demo`` and
``make test`` install, rather than stopping at ``flock: not found``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def planned_install(path: str) -> str:
    """The commands ``make install`` would run (``make -n -B``) with ``path`` as PATH."""
    done = subprocess.run(
        ["make", "-n", "-B", "install"],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_the_install_takes_the_lock_with_flock_and_runs_without_it(tmp_path: Path) -> None:
    # (The install line began with flock, which macOS lacks: on a fresh Mac `make demo`, the
    # README's first command, stopped with "flock: command not found" before installing.)
    make, sh = shutil.which("make"), shutil.which("sh")
    assert make is not None
    assert sh is not None
    # Given a PATH that holds make and sh but no flock
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in (make, sh):
        (bare / Path(tool).name).symlink_to(tool)
    # Then the install is planned without flock, and with it where flock is
    without = [line for line in planned_install(str(bare)).splitlines() if "pip install" in line]
    assert len(without) == 2, without
    assert not any("flock" in line for line in without), without
    if shutil.which("flock") is not None:
        assert "flock .venv/.install.lock" in planned_install(os.environ["PATH"])
