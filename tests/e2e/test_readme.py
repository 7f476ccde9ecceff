"""README.md's snippets run as written, each in a PostgreSQL schema of its own, so they cannot drift.

The convention, for anyone adding a section to the README: put an HTML comment (invisible
when rendered) on the line right before a fenced block:

    <!-- readme-test: run -->                           the block runs as written
    <!-- readme-test: run, same as examples/x.py -->    ... and must equal that file, byte for byte
    <!-- readme-test: skip: why it cannot run -->       it does not run (say why)

Every ```python block needs one of them (an unmarked one fails
``test_every_python_snippet_is_marked``); a ```bash block runs only when marked ``run``.
A python block runs as a script; a bash block runs line by line under ``bash -euo pipefail``
with the project's executables first on PATH (``flowledger``, ``python``). Both run from the
repository root with FLOWLEDGER_DATABASE_URL set to the test server and FLOWLEDGER_SCHEMA to
a fresh schema (both documented in the README's Configuration table), and no model endpoint
configured: a snippet that calls a model starts the built-in simulator, as
``examples/process_step.py`` does. A snippet passes when it exits 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.schemas import drop_schemas, scratch_schema

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*readme-test:\s*(run|skip)\b(.*?)-->")
_SAME_AS = re.compile(r"same as\s+(\S+)")


@dataclass(frozen=True)
class Snippet:
    """One fenced block of the README, with where it is and how it is marked."""

    language: str
    code: str
    line: int
    heading: str
    mark: str | None  # "run", "skip" or None
    same_as: str | None

    @property
    def name(self) -> str:
        return f"{self.heading} (line {self.line})"


def snippets(text: str) -> list[Snippet]:
    """The README's fenced blocks, each with its mark (the comment on the line before it)."""
    found = []
    for fence in _FENCE.finditer(text):
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        headings = re.findall(r"^#+ (.+)$", text[: fence.start()], re.MULTILINE)
        same_as = _SAME_AS.search(mark.group(2)) if mark else None
        found.append(
            Snippet(
                language=fence.group(1),
                code=fence.group(2),
                line=text[: fence.start()].count("\n") + 1,
                heading=headings[-1] if headings else "top",
                mark=mark.group(1) if mark else None,
                same_as=same_as.group(1) if same_as else None,
            )
        )
    return found


ALL = snippets(README.read_text(encoding="utf-8"))
RUNNABLE = [s for s in ALL if s.mark == "run"]


def test_every_python_snippet_is_marked() -> None:
    unmarked = [s.name for s in ALL if s.language == "python" and s.mark is None]
    assert not unmarked, f"mark these README blocks with <!-- readme-test: run --> or skip: {unmarked}"
    assert len(RUNNABLE) >= 3


def test_the_marks_parse_as_the_convention_says() -> None:
    text = (
        "# A\n<!-- readme-test: run, same as examples/x.py -->\n```python\nprint(1)\n```\n"
        "\n```bash\nls\n```\n"
    )
    first, second = snippets(text)
    assert (first.language, first.code, first.mark, first.same_as, first.heading) == (
        "python",
        "print(1)\n",
        "run",
        "examples/x.py",
        "A",
    )
    assert (second.language, second.mark) == ("bash", None)


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.name for s in RUNNABLE])
def test_the_readme_snippet_runs_as_written(snippet: Snippet, database_url: str, run_schemas: str) -> None:
    if snippet.same_as is not None:
        assert (ROOT / snippet.same_as).read_text(encoding="utf-8") == snippet.code, (
            f"the README block at line {snippet.line} differs from {snippet.same_as}"
        )
    schema = scratch_schema("readme")
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWLEDGER_LLM_")}
    env |= {
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": schema,
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "COLUMNS": "160",
    }
    if snippet.language == "python":
        command = [sys.executable, "-c", snippet.code]
    elif snippet.language in ("bash", "sh", "shell"):
        command = ["bash", "-euo", "pipefail", "-c", snippet.code]
    else:
        pytest.fail(f"README block at line {snippet.line}: cannot run a {snippet.language!r} block")
    try:
        result = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
        )
    finally:
        drop_schemas(database_url, schema)
    assert result.returncode == 0, (
        f"README block at line {snippet.line} ({snippet.heading}) exited {result.returncode}:\n"
        f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    assert "Traceback" not in result.stderr
