"""The soak's 60-second form (``make soak`` runs it for 10 minutes): three servers, two
followers, a faulty model, a rebuild and a restart under mixed load; nothing acknowledged is
lost, nothing is stored twice, no agent goes over capacity, the projections equal a rebuild."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.soak import check_succeeded, run_soak

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(420)]

SECONDS = float(os.environ.get("FLOWLEDGER_SOAK_SECONDS", "60"))


def test_a_minute_of_mixed_load_loses_and_doubles_nothing(
    database_url: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():
        console = Console(width=140)
        report = run_soak(database_url, pg_schema, tmp_path, SECONDS, console=console)
        report.print(console)
    assert check_succeeded(report) == []
    assert all(t.acknowledged > 0 for t in report.tallies), report.tallies
    assert report.loads.accepted > 0
    assert {row.kind for row in report.latencies} >= {"process_step", "assign_task", "dashboard", "funnel"}
