"""``flowledger serve`` runs on uvloop and parses HTTP with httptools when the ``speed`` extra is
installed, on asyncio and h11 when it is not, and says which (``adapters/cli/serve.py``)."""

from __future__ import annotations

import asyncio
import builtins
import importlib.util
import sys
from typing import Any

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


def broken(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """As if ``module`` were installed but failed to import (built for another Python, a
    library it links missing): find_spec still finds it, ``import`` raises ImportError."""
    monkeypatch.delitem(sys.modules, module, raising=False)
    real_import = builtins.__import__

    def importing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == module:
            raise ImportError(f"{module}/loop.so: undefined symbol: PyFoo")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)


def test_auto_runs_on_asyncio_when_uvloop_is_installed_but_does_not_import(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given uvloop installed but failing to import
    broken(monkeypatch, "uvloop")
    assert importlib.util.find_spec("uvloop") is not None
    # When serve picks its loop by itself, then it runs on asyncio (it was refused: "uvloop is
    # not installed", and serve did not start)
    assert loop_runner(Loop.auto) == ("asyncio", asyncio.run)
    # and says why it is not on uvloop
    assert "uvloop is installed but does not import" in capsys.readouterr().err


def test_uvloop_asked_for_but_not_importing_is_refused_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    broken(monkeypatch, "uvloop")
    with pytest.raises(
        ValidationError, match=r"^loop: uvloop is installed but does not import: .*undefined symbol"
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


def test_the_auto_parser_is_h11_when_httptools_is_installed_but_does_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was named httptools, and uvicorn failed to import it once serving began
    broken(monkeypatch, "httptools")
    assert http_parser("auto") == "h11"
    with pytest.raises(
        ValidationError, match=r"^http: httptools is installed but does not import: .*undefined"
    ):
        http_parser("httptools")


def test_serve_says_which_loop_and_parser_it_runs_on() -> None:
    assert serving_line("uvloop", "httptools") == "serving on uvloop, HTTP parsed by httptools"
    assert serving_line("asyncio", "h11") == "serving on asyncio, HTTP parsed by h11"
