"""The layering in DESIGN.md holds: dependencies point inward, only adapters talk HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_domain_reads_no_environment_and_does_no_io() -> None:
    forbidden = [
        r"^import os\b",
        r"^from os\b",
        r"\bpsycopg\b",
        r"\bhttpx\b",
        r"(?<![.\w])open\(",
        r"datetime\.now\(",
        r"\btime\.time\(",
        r"\bos\.environ\b",
    ]
    offenders = [
        f"{path.name}: {pattern}"
        for path in (ROOT / "domain").glob("*.py")
        for pattern in forbidden
        if re.search(pattern, path.read_text(), re.MULTILINE)
    ]
    assert offenders == []
