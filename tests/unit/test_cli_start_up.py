"""The command line starts without the web stack: only ``serve`` (and the simulator) need it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flowledger.adapters.llm as llm
import flowledger.adapters.simulator as simulator

WEB_STACK = ("fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "pydantic")


def _modules_after(statement: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running ``statement``."""
    probe = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    command = [sys.executable, "-c", probe]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    return {name.split(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


def test_loading_the_command_line_imports_no_web_framework_or_http_client() -> None:
    # Given a fresh interpreter
    # When the command line's app (every command registered) is loaded
    loaded = _modules_after("import flowledger.adapters.cli.main")
    # Then none of the web stack came with it (it was half of every command's start-up)
    assert loaded.isdisjoint(WEB_STACK), sorted(loaded.intersection(WEB_STACK))


def test_the_adapter_packages_still_export_their_names_on_first_use() -> None:
    # Given the packages whose names are now imported when first used
    loaded = _modules_after(
        "from flowledger.adapters.llm import OpenAICompatibleClient, load_price_table\n"
        "from flowledger.adapters.simulator import SimulatorConfig, run_simulator\n"
        "assert OpenAICompatibleClient.__name__ == 'OpenAICompatibleClient' and callable(run_simulator)"
    )
    # Then the names resolve (and bring the HTTP client with them)
    assert "httpx" in loaded
    assert "aiohttp" in loaded


def test_an_unknown_name_of_the_adapter_packages_is_an_attribute_error() -> None:
    for package in (llm, simulator):
        with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
            getattr(package, "nothing_here")  # noqa: B009
