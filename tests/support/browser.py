"""Headless Chromium for the browser tests: Debian's ``chromium``, driven from the command line.

Every run blocks the network outside loopback (a dead proxy, and host names that resolve to
nothing), so a page that needs a CDN shows it. Chromium is found on the PATH; when it is
missing in CI (``CI=true``) and we are root, it is installed with apt-get, and otherwise the
test fails saying so; outside CI the browser tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.debian import in_ci, install_in_ci

NAMES = ("chromium", "chromium-browser")
ARTIFACTS = Path(
    os.environ.get("FLOWLEDGER_TEST_ARTIFACTS", Path(__file__).parents[2] / ".venv" / "test-artifacts")
)
"""Where the browser tests keep their screenshots (inside .venv: ignored by git)."""

_OFFLINE = (
    "--proxy-server=http://127.0.0.1:9",  # nothing listens there: every outside request fails
    "--proxy-bypass-list=<-loopback>;127.0.0.1",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


def _found() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def chromium() -> str:
    """The path of the Chromium executable (installed first in CI when it can be)."""
    if install_in_ci(["chromium"], lambda: _found() is not None):
        return _found() or NAMES[0]
    message = (
        "headless Chromium is needed for the browser tests: install it with `apt-get install -y chromium`"
    )
    if in_ci():
        pytest.fail(f"{message} (CI=true, and it could not be installed here)")
    pytest.skip(f"{message}; they run in CI")


def _run(url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="flowledger-chromium-") as profile:
        command = [
            chromium(),
            "--headless",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *_OFFLINE,
            *args,
            url,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    return result


def dom_after_scripts(url: str, *, budget_ms: int = 8000, width: int = 1280, height: int = 1200) -> str:
    """The page's DOM once its scripts ran (virtual time ``budget_ms``), with no outside network."""
    return _run(
        url, f"--virtual-time-budget={budget_ms}", f"--window-size={width},{height}", "--dump-dom"
    ).stdout


def console_lines(url: str, *, budget_ms: int = 8000, width: int = 1280, height: int = 1200) -> list[str]:
    """What the page wrote to the browser's console once its scripts ran (virtual time
    ``budget_ms``), a refusal by its Content-Security-Policy included, one line each."""
    result = _run(
        url,
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={width},{height}",
        "--enable-logging=stderr",
        "--v=0",
        "--dump-dom",
    )
    return [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def screenshot(url: str, name: str, *, width: int = 1280, height: int = 1600, budget_ms: int = 5000) -> Path:
    """A PNG of the page, kept under ``ARTIFACTS`` as ``name``; its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    _run(url, f"--virtual-time-budget={budget_ms}", f"--window-size={width},{height}", f"--screenshot={path}")
    assert path.exists(), f"chromium wrote no screenshot at {path}"
    return path
