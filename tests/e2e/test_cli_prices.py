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


def test_prices_show_writes_whole_and_zero_prices_per_million_with_every_digit(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # Given a free model and one whose per-token keys hold per-million figures (a careless file)
    (tmp_path / "p.json").write_text(
        '{"version": "v", "models": {"free": {"input_cost_per_token": 0, "output_cost_per_token": 0.0},'
        ' "per-million": {"input_cost_per_token": 2, "output_cost_per_token": 8,'
        ' "cache_read_input_token_cost": 0.5}, "cheap": {"input_cost_per_token": 1E-5,'
        ' "output_cost_per_token": 3.5e-7}}}'
    )
    # When the table is shown
    shown = run_cli(database_url, pg_schema, "prices", "show", "--file", str(tmp_path / "p.json"))
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines() if line.strip()}
    # Then $2 a token reads 2000000 per million (it read "2", as if it were right), zero reads 0
    # (a blank cell), and fractions keep their digits
    assert rows["per-million"][:6] == ["always", "2000000", "500000", "-", "-", "8000000"]
    assert rows["free"][:6] == ["always", "0", "-", "-", "-", "0"]
    assert rows["cheap"][:6] == ["always", "10", "-", "-", "-", "0.35"]


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_reprice_from_a_time_outside_the_years_1_to_9999_in_utc_is_refused_and_writes_nothing(
    database_url: str, pg_schema: str, start: str
) -> None:
    """A repricing is read back by every build of the cost projection: one from year 1 BC (or
    10000) in UTC was recorded, then every rebuild set each call aside as a dead letter and every
    later reprice failed, as the driver cannot read such a time. It is refused (exit 2, one
    line) and nothing is recorded: a later reprice and a rebuild still work."""
    # Given a recorded call
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("p-9", "cs")
        usage = LlmUsage(
            request_model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=Decimal("0.01")
        )
        engine.record_step("p-9", "greet", usage=usage)
    # When a repricing from a time that lies before year 1 (or after 9999) in UTC is applied
    refused = run_cli(database_url, pg_schema, "prices", "reprice", "--from", start)
    # Then it is refused in one line, exit 2
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"error: from: must lie within the years 1 to 9999 in UTC, got {start}"
    ]
    # And nothing was recorded: the projections rebuild with no dead letter, the call is still
    # on the dashboard, and a later reprice works
    rebuilt = run_cli(database_url, pg_schema, "projections", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "0.0100" in run_cli(database_url, pg_schema, "dashboard", "--since", "2h").stdout
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    later = run_cli(database_url, pg_schema, "prices", "reprice", "--from", since, "--dry-run")
    assert later.returncode == 0, later.stderr


def test_a_reprice_from_digits_alone_is_refused_as_every_time_option_refuses_them(
    database_url: str, pg_schema: str
) -> None:
    """``20261130`` (ISO's basic date) and ``1796425540`` (seconds or milliseconds?) are no time
    to the other time options (``parse_time``); ``--from`` took the first as a date."""
    for digits in ("20261130", "1796425540"):
        refused = run_cli(database_url, pg_schema, "prices", "reprice", "--from", digits, "--dry-run")
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.strip().splitlines() == [
            f"error: from: '{digits}' is a number, not a time or date: give one like 2026-11-30"
        ]


def test_the_dashboards_what_if_takes_a_model_by_any_name_its_calls_are_priced_by(
    database_url: str, pg_schema: str
) -> None:
    """``dashboard --reprice-as openai/gpt-4.1`` (or ``gpt-4.1-2025-04-14``) said "no price for
    'openai/gpt-4.1'" (exit 2), though a call by that name is priced as gpt-4.1; REST's
    ``?reprice_as=`` likewise (422). The name is resolved as a call's is."""
    # Given a recorded gpt-4.1 call: 100 in, 10 out
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("p-2", "cs")
        usage = LlmUsage(
            request_model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=Decimal("0.01")
        )
        engine.record_step("p-2", "greet", usage=usage)
    for name in ("openai/gpt-4.1", "gpt-4.1-2025-04-14"):
        # When the what-if names the model as calls name it
        done = run_cli(database_url, pg_schema, "dashboard", "--since", "2h", "--reprice-as", name)
        # Then it prices the usage at gpt-4.1's shipped price: 100 x $2/M + 10 x $8/M
        assert done.returncode == 0, done.stderr
        assert "0.000280" in done.stdout
        assert "-0.009720" in done.stdout
