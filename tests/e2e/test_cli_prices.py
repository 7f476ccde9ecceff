"""``flowledger prices``: the reprice dry run, applying it, and bad input (one line, exit 2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli


def test_a_dry_run_shows_the_change_per_model_and_day_and_applying_it_reprices_the_dashboard(
    database_url: str, pg_schema: str
) -> None:
    # Given a call recorded at a made-up cost
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("p-1", "cs")
        usage = LlmUsage(
            request_model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=Decimal("0.01")
        )
        engine.record_step("p-1", "greet", usage=usage)
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    # When the dry run is asked for
    dry = run_cli(database_url, pg_schema, "prices", "reprice", "--from", since, "--dry-run")
    # Then it shows the shipped price's cost beside the recorded one: 100 x $2/M + 10 x $8/M
    assert dry.returncode == 0, dry.stderr
    assert "(dry run: nothing is written)" in dry.stdout
    assert "gpt-4.1" in dry.stdout
    assert "0.010000" in dry.stdout
    assert "0.000280" in dry.stdout
    assert "-0.009720" in dry.stdout
    before = run_cli(database_url, pg_schema, "dashboard", "--since", "2h")
    assert "0.0100" in before.stdout
    # When it is applied, the projection holds the new cost
    applied = run_cli(database_url, pg_schema, "prices", "reprice", "--from", since)
    assert applied.returncode == 0, applied.stderr
    assert "applied: the cost projection was rebuilt" in applied.stdout
    after = run_cli(database_url, pg_schema, "dashboard", "--since", "2h")
    assert "0.00028" in after.stdout  # as the dry run said: exact, not rounded to 0.0003
    assert "0.0100" not in after.stdout


def test_a_bad_time_or_price_file_exits_2_with_one_line(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    bad_time = run_cli(database_url, pg_schema, "prices", "reprice", "--from", "last tuesday", "--dry-run")
    assert bad_time.returncode == 2
    assert bad_time.stderr.strip().count("\n") == 0
    assert "from" in bad_time.stderr
    (tmp_path / "p.json").write_text('{"version": 3}')
    bad = run_cli(
        database_url,
        pg_schema,
        "prices",
        "reprice",
        "--from",
        "2025-10-01",
        "--file",
        str(tmp_path / "p.json"),
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0
    assert "pricing_file" in bad.stderr
    # A file that cannot be read at all is 74, as for every command (test_cli_file_refusals.py)
    missing = run_cli(
        database_url, pg_schema, "prices", "reprice", "--from", "2025-10-01", "--file", "/nonexistent/p.json"
    )
    assert missing.returncode == 74


def test_a_configured_price_file_that_is_not_utf8_is_a_settings_error_naming_the_file_and_why(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given FLOWLEDGER_PRICING_FILE naming a file in UTF-16 (its byte-order mark is no UTF-8)
    (tmp_path / "prices16.json").write_bytes('{"version": 3}'.encode("utf-16"))
    monkeypatch.setenv("FLOWLEDGER_PRICING_FILE", str(tmp_path / "prices16.json"))
    # When the prices are shown
    shown = run_cli(database_url, pg_schema, "prices", "show")
    # Then it is a bad setting (exit 2, as any other fault of the configured file), one line
    # naming the file and saying it is not UTF-8, not that it is not JSON
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr.strip().splitlines() == [
        "error: pricing_file: prices16.json is not UTF-8 text: byte 0 (invalid start byte)"
    ]


def test_prices_show_lists_dated_entries_and_aliases(database_url: str, pg_schema: str) -> None:
    shown = run_cli(database_url, pg_schema, "prices", "show")
    assert shown.returncode == 0, shown.stderr
    assert "2025-09-29 16:00Z" in shown.stdout
    assert "alias claude-sonnet-4-5 -> claude-sonnet-4.5" in shown.stdout
