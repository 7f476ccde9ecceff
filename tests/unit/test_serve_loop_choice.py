"""``flowledger serve`` runs on uvloop and parses HTTP with httptools when the ``speed`` extra is
installed, on asyncio and h11 when it is not, and says which (``adapters/cli/serve.py``)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from flowledger.adapters.cli.serve import Loop, http_parser, loop_runner, serving_line
from flowledger.domain.errors import ValidationError


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """As if ``modules`` were not installed (``None`` in sys.modules: find_spec says None, import fails)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_auto_runs_on_uvloop_when_it_is_installed() -> None:
    name, run = loop_runner(Loop.auto)
    seen: list[str] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run(main())
    assert name == "uvloop"
    assert seen[0].startswith("uvloop")


def test_auto_runs_on_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "uvloop")
    assert loop_runner(Loop.auto) == ("asyncio", asyncio.run)


def test_uvloop_asked_for_and_not_installed_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "uvloop")
    with pytest.raises(
        ValidationError, match=r"^loop: uvloop is not installed \(pip install 'flowledger\[speed\]'\)$"
    ):
        loop_runner(Loop.uvloop)


def test_the_auto_parser_is_named_for_what_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" went to uvicorn as it was: the line said the loop, never the parser.
    assert http_parser("auto") == "httptools"
    without(monkeypatch, "httptools")
    assert http_parser("auto") == "h11"
    assert http_parser("h11") == "h11"
    with pytest.raises(ValidationError, match="httptools is not installed"):
        http_parser("httptools")


def test_serve_says_which_loop_and_parser_it_runs_on() -> None:
    assert serving_line("uvloop", "httptools") == "serving on uvloop, HTTP parsed by httptools"
    assert serving_line("asyncio", "h11") == "serving on asyncio, HTTP parsed by h11"
