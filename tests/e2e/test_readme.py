"""README.md's snippets (and docs/*.md's) run as written, each in a PostgreSQL schema of its own,
so they cannot drift.

The convention, for anyone adding a section to the README or a doc: put an HTML comment
(invisible when rendered) on the line right before a fenced block:

    <!-- readme-test: run -->                           the block runs as written
    <!-- readme-test: run, same as examples/x.py -->    ... and must equal that file, byte for byte
    <!-- readme-test: run, with a server -->            ... with `flowledger serve` answering at
                                                        localhost:8000 (see below)
    <!-- readme-test: run, with a simulator -->         ... with FLOWLEDGER_LLM_BASE_URL naming the
                                                        built-in simulator, for the CLI's model calls
    <!-- readme-test: skip: why it cannot run -->       it does not run (say why)

Every ```python block needs one of them (an unmarked one fails
``test_every_python_snippet_is_marked``); a ```bash block runs only when marked ``run``.
A block run ``with a server`` gets ``flowledger serve --simulate-llm`` on a free port (its
``localhost:8000`` rewritten to it) and the keys ``$KEY`` (writer), ``$READER_KEY`` and
``$ADMIN_KEY`` of the default tenant; its ``curl`` fails on an HTTP error status, and a
comment that starts with ``# {`` or ``# [`` (continued on comment lines indented by two
spaces or more) is output the block must print: each piece between ``...`` in order; so is a
comment line that starts with ``#>``, in any ```bash block that runs.
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
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import typer.main

from flowledger.adapters.cli.errors import EXIT_CODES
from flowledger.adapters.cli.main import app
from flowledger.adapters.simulator import run_simulator
from tests.support.cluster import free_port
from tests.support.schemas import drop_schemas, scratch_schema

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = (README, *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*readme-test:\s*(run|skip)\b(.*?)-->")
_SAME_AS = re.compile(r"same as\s+(\S+)")
_WITH_SERVER = re.compile(r"\bwith a server\b")
_WITH_SIMULATOR = re.compile(r"\bwith a simulator\b")
_SHOWN_PORT = "localhost:8000"
_FAIL_ON_HTTP_ERRORS = 'curl() { command curl --fail-with-body "$@"; }\n'


@dataclass(frozen=True)
class Snippet:
    """One fenced block of the README, with where it is and how it is marked."""

    language: str
    code: str
    line: int
    heading: str
    mark: str | None  # "run", "skip" or None
    same_as: str | None
    with_server: bool = False
    source: str = "README.md"
    with_simulator: bool = False

    @property
    def name(self) -> str:
        where = "" if self.source == "README.md" else f"{self.source}: "
        return f"{where}{self.heading} (line {self.line})"


def expected_output(code: str) -> list[list[str]]:
    """The outputs a block says it prints: each ``# {`` / ``# [`` comment with its indented
    continuation lines, joined, and each ``#>`` line, as the pieces between their ``...``."""
    shown: list[list[str]] = []
    text: str | None = None
    for line in [*code.splitlines(), ""]:
        if text is not None and re.match(r"#\s{2,}\S", line):
            text += line[1:].strip()
            continue
        if text is not None:
            shown.append([piece for piece in text.split("...") if piece])
            text = None
        if re.match(r"# [\[{]", line):
            text = line[2:].strip()
        elif line.startswith("#> "):
            shown.append([piece for piece in line[3:].strip().split("...") if piece])
    return shown


def snippets(text: str, source: str = "README.md") -> list[Snippet]:
    """The README's fenced blocks, each with its mark (the comment on the line before it)."""
    found = []
    for fence in _FENCE.finditer(text):
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        # Headings outside fenced blocks: a bash comment is no heading.
        headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", text[: fence.start()]), re.MULTILINE)
        same_as = _SAME_AS.search(mark.group(2)) if mark else None
        found.append(
            Snippet(
                language=fence.group(1),
                code=fence.group(2),
                line=text[: fence.start()].count("\n") + 1,
                heading=headings[-1] if headings else "top",
                mark=mark.group(1) if mark else None,
                same_as=same_as.group(1) if same_as else None,
                with_server=bool(mark and _WITH_SERVER.search(mark.group(2))),
                source=source,
                with_simulator=bool(mark and _WITH_SIMULATOR.search(mark.group(2))),
            )
        )
    return found


ALL = [s for path in DOCS for s in snippets(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
RUNNABLE = [s for s in ALL if s.mark == "run"]


def test_every_python_snippet_is_marked() -> None:
    unmarked = [s.name for s in ALL if s.language == "python" and s.mark is None]
    assert not unmarked, f"mark these blocks with <!-- readme-test: run --> or skip: {unmarked}"
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
    assert (second.language, second.mark, first.with_server) == ("bash", None, False)
    (served,) = snippets("<!-- readme-test: run, with a server -->\n```bash\ncurl x\n```\n")
    assert (served.mark, served.with_server, served.with_simulator) == ("run", True, False)
    (modelled,) = snippets("<!-- readme-test: run, with a simulator -->\n```bash\nflowledger x\n```\n")
    assert (modelled.mark, modelled.with_server, modelled.with_simulator) == ("run", False, True)


def test_a_served_block_says_its_output_in_comments_cut_at_ellipses() -> None:
    code = 'curl -s x  # [not this]\n# [{"a":1,...,"b":2,\n#   "c":3}]\n# not output\ncurl -s y\n# {"d":4}\n'
    assert expected_output(code) == [['[{"a":1,', ',"b":2,"c":3}]'], ['{"d":4}']]
    assert expected_output("flowledger x  #> not this\n#> done: 1 ... (2)\n#>no\n") == [["done: 1 ", " (2)"]]


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.name for s in RUNNABLE])
def test_the_readme_snippet_runs_as_written(
    snippet: Snippet, database_url: str, run_schemas: str, stack: ExitStack
) -> None:
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
    code = snippet.code
    if snippet.language == "python":
        command = [sys.executable, "-c", code]
    elif snippet.language in ("bash", "sh", "shell"):
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        pytest.fail(f"{snippet.source} block at line {snippet.line}: cannot run a {snippet.language!r} block")
    if snippet.with_simulator:
        simulator = stack.enter_context(run_simulator())
        env |= {"FLOWLEDGER_LLM_BASE_URL": simulator.base_url, "FLOWLEDGER_LLM_API_KEY": "sk-simulator"}
    try:
        with served(env, bin_dir) if snippet.with_server else _nothing() as (address, keys):
            if snippet.with_server:
                code = _FAIL_ON_HTTP_ERRORS + snippet.code.replace(_SHOWN_PORT, address)
                command[-1] = code
            result = subprocess.run(
                command, cwd=ROOT, env=env | keys, capture_output=True, text=True, timeout=240, check=False
            )
    finally:
        drop_schemas(database_url, schema)
    assert result.returncode == 0, (
        f"{snippet.source} block at line {snippet.line} ({snippet.heading}) exited {result.returncode}:\n"
        f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    assert "Traceback" not in result.stderr
    if snippet.language != "python":
        for pieces in expected_output(snippet.code):
            at = 0
            for piece in pieces:
                found = result.stdout.find(piece, at)
                assert found >= 0, (
                    f"block at line {snippet.line} shows {piece!r}, which it did not print:\n{result.stdout}"
                )
                at = found + len(piece)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """What a snippet's run holds open (the simulator), closed after it."""
    with ExitStack() as held:
        yield held


@contextmanager
def _nothing() -> Iterator[tuple[str, dict[str, str]]]:
    yield _SHOWN_PORT, {}


@contextmanager
def served(env: dict[str, str], bin_dir: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``flowledger serve --simulate-llm`` on a free port with keys of the default tenant: its
    ``host:port`` and the keys, as the environment variables the README's blocks use."""
    keys = {name: f"default-{role}-{secrets.token_hex(12)}" for name, role in _ROLES}
    configured = ",".join(f"default:{role}:{keys[name]}" for name, role in _ROLES)
    port = free_port()
    server = subprocess.Popen(
        [str(Path(bin_dir) / "flowledger"), "serve", "--port", str(port), "--simulate-llm"],
        cwd=ROOT,
        env=env | {"FLOWLEDGER_API_KEYS": configured},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90  # the machine is shared
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"flowledger serve did not start: {server.communicate()[1][-2000:]}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", keys
    finally:
        server.terminate()
        try:
            server.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


_ROLES = (("KEY", "writer"), ("READER_KEY", "reader"), ("ADMIN_KEY", "admin"))


def _section(title: str) -> str:
    """The README's text under the heading ``title``, up to the next heading of its level."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_command_line_block_names_every_command_and_subcommand() -> None:
    # Given the README's "Command line" block, and the commands the executable has
    block = _FENCE.search(_section("Command line"))
    assert block is not None
    lines = [line.split("#", 1)[0] for line in block.group(2).splitlines()]
    commands: dict[str, object] = getattr(typer.main.get_command(app), "commands")  # noqa: B009
    # Then each command starts a line of it, and each of a group's commands is named there
    for name, command in commands.items():
        own = [line for line in lines if line.startswith(f"flowledger {name} ")]
        assert own, f"the README's Command line block does not list `flowledger {name}`"
        group: dict[str, object] = getattr(command, "commands", {})  # a group's own commands
        if group:
            words = set(re.findall(r"[\w-]+", " ".join(own)))
            missing = sorted(set(group) - words)
            assert not missing, f"`flowledger {name}`: the README does not name {missing}"


def test_the_exit_code_table_lists_every_code_the_cli_exits_with() -> None:
    # Given the exit codes of the README's table and those of adapters/cli/errors.py
    shown = {int(code) for code in re.findall(r"^\| (\d+) \|", _section("Command line"), re.MULTILINE)}
    # Then they are the same codes
    assert shown == {code for _, code in EXIT_CODES}


_NAMED_PATH = re.compile(r"`((?:[\w.*-]+/)+[\w.*-]+\.(?:py|md|json|toml|sh|ya?ml|html|txt|cfg|ini|jsonl))`")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_every_file_the_readme_and_the_docs_name_is_there() -> None:
    # (docs/recorder.md named infrastructure/keyed_locks.py and docs/tasks.md
    # infrastructure/task_index.py, both moved to infrastructure/engine/; docs/write-path.md named
    # files as postgres/chain.py, found from no folder a reader starts in.)
    # Given every relative link of README.md and docs/*.md, and every repository path they quote
    # in backticks (a file the tests or a make target write, under .venv/, is not in a clone)
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for link in _LINK.findall(text):
            if not re.match(r"[a-z]+:", link) and not (doc.parent / link).exists():
                missing.append(f"{doc.name}: link {link}")
        for path in _NAMED_PATH.findall(text):
            if not path.startswith(".venv/") and not list(ROOT.glob(path)):
                missing.append(f"{doc.name}: `{path}`")
    # Then each names a file of the repository, from its root (a link: from the page's folder)
    assert not missing, f"these files are not in the repository: {missing}"


def test_the_readme_names_every_make_target() -> None:
    # (make install, test-deep and clean were not named: a newcomer who added a module met an
    # ImportError, the strict editable install needing `make install` again, unexplained.)
    # Given the Makefile's targets
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    assert {"demo", "test"} <= targets
    # Then the README names each as a make command
    text = README.read_text(encoding="utf-8")
    assert sorted(t for t in targets if not re.search(rf"`make {t}`", text)) == []


def test_the_readme_says_what_the_seed_is_before_it_names_it() -> None:
    # ("the seed's task-assignment scenario", "as the seed did": nineteen mentions, and nowhere
    # did the README say that the seed is the two guides flowledger was built against.)
    text = _FENCE.sub("", README.read_text(encoding="utf-8"))
    first = re.search(r"\bseed\b", text, re.IGNORECASE)
    assert first is not None
    sentence = text[text.rfind(".", 0, first.start()) + 1 : text.find(".", first.end())]
    assert "**the\nseed**" in sentence or "**the seed**" in sentence, sentence


def test_the_readmes_list_of_deeper_notes_names_every_docs_page() -> None:
    # (It named seven of the eleven pages: not docs/http.md, budgets.md, erasure.md or scaling.md.)
    text = README.read_text(encoding="utf-8")
    notes = text[text.index("Deeper\nnotes:") :]
    notes = notes[: notes.index("\n\n")] if "\n\n" in notes else notes
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert sorted(page for page in pages if f"`{page}`" not in notes) == []
