"""Running the ``flowledger`` executable in a subprocess against one database schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FLOWLEDGER = str(Path(sys.executable).parent / "flowledger")


def run_cli(
    database_url: str, schema: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``flowledger *args`` on ``schema`` of ``database_url``, 200 columns wide, output captured."""
    env = {
        **os.environ,
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": schema,
        "COLUMNS": "200",
    }
    return subprocess.run(
        [FLOWLEDGER, *args], env=env, capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )
