"""Running ``flowledger`` commands against one database schema, as a user would.

``run_cli`` runs the command line's entry point (``adapters.cli.main.main``, what the
installed executable calls) in this process, with the environment, working directory and
standard streams a subprocess would have: the same exit code and output, without starting
an interpreter and importing everything again for every command (about 4 s each under
coverage). ``run_cli_process`` runs the installed executable itself, for the tests that
need a process of its own (its entry point, signals, a server).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import chdir, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from rich.console import Console

from flowledger.adapters.cli.main import main

FLOWLEDGER = str(Path(sys.executable).parent / "flowledger")


def _environment(database_url: str, schema: str) -> dict[str, str]:
    return {"FLOWLEDGER_DATABASE_URL": database_url, "FLOWLEDGER_SCHEMA": schema, "COLUMNS": "200"}


@contextmanager
def _patched_environ(changes: dict[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _wide_consoles(columns: int) -> Iterator[None]:
    """The CLI modules' consoles ``columns`` wide meanwhile: a console made at import takes
    its width from the environment then (80 in a pytest-xdist worker), not from COLUMNS now."""
    consoles = [
        value
        for name, module in list(sys.modules.items())
        if name.startswith("flowledger.adapters.cli")
        for value in vars(module).values()
        if isinstance(value, Console)
    ]
    sizes = [console.size for console in consoles]
    for console in consoles:
        console.size = (columns, console.size.height)
    try:
        yield
    finally:
        for console, size in zip(consoles, sizes, strict=True):
            console.size = size


def run_cli(
    database_url: str,
    schema: str,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    columns: int = 200,
) -> subprocess.CompletedProcess[str]:
    """``flowledger *args`` on ``schema`` of ``database_url``, ``columns`` wide (200 unless
    told: 80 is what rich assumes of a pipe), output captured (``env``: more environment
    variables, set meanwhile)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        _patched_environ({**_environment(database_url, schema), "COLUMNS": str(columns), **(env or {})}),
        _wide_consoles(columns),
        chdir(cwd if cwd is not None else Path.cwd()),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        try:
            main(list(args))
            code = 0
        except SystemExit as ended:
            code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    return subprocess.CompletedProcess([FLOWLEDGER, *args], code, out.getvalue(), err.getvalue())


def run_cli_process(
    database_url: str, schema: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """As ``run_cli``, through the installed ``flowledger`` executable in a process of its own."""
    env = {**os.environ, **_environment(database_url, schema)}
    return subprocess.run(
        [FLOWLEDGER, *args], env=env, capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )
