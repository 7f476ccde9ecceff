"""A price file named by the operator that cannot be read refuses the engine at start, in one
line naming the variable and the path; before, an engine without a model endpoint started, and
the file was found missing only by the first use of the prices (a repricing, the tier panel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli


@pytest.mark.parametrize("name", ["missing.json", "."], ids=["missing", "a directory"])
def test_an_engine_is_refused_a_price_file_it_cannot_read(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(ValidationError) as refused:
        Engine(settings=make_settings(database_url="memory:", pricing_file=path))
    said = str(refused.value)
    assert said.startswith(f"pricing_file: FLOWLEDGER_PRICING_FILE names {path}, which cannot be read: ")
    assert "\n" not in said


def test_a_command_is_refused_a_missing_price_file_with_exit_2_and_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "prices.json"
    ran = run_cli("memory:", "s", "history", "x", env={"FLOWLEDGER_PRICING_FILE": str(missing)})
    assert ran.returncode == 2
    assert ran.stderr == (
        f"error: pricing_file: FLOWLEDGER_PRICING_FILE names {missing},"
        " which cannot be read: No such file or directory\n"
    )
