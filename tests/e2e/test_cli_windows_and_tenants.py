"""The analytics commands refuse what they cannot show in one line and before printing anything:
a window longer than the longest (it overflowed into a "bug" exit), a model without a price for
``--reprice-as``, and a tenant that is not a name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.durations import MAX_SINCE, parse_since
from flowledger.domain import LlmUsage
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.test_cli_sessions import run


@pytest.mark.parametrize(
    "args",
    [
        ("dashboard", "--since", "99999999999d"),
        ("dashboard", "--since", "1000000d", "--exact"),
        ("funnel", "customer_service", "--since", "99999999999d"),
        ("funnel", "customer_service", "--since", "1000000d"),
    ],
)
def test_a_window_longer_than_the_longest_is_a_usage_error(
    database_url: str, pg_schema: str, args: tuple[str, ...]
) -> None:
    # When a dashboard or funnel is asked for a window of thousands of years
    done = run(database_url, pg_schema, *args)
    # Then it is refused in one line with the usage exit code (it was 70, "a bug")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        f"error: since: '{args[args.index('--since') + 1]}' is longer than the longest window, 99999w"
    ]
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("dashboard", "--since", "0h"),
        ("dashboard", "--since", "000m", "--exact"),
        ("funnel", "customer_service", "--since", "0d"),
    ],
)
def test_an_empty_window_is_a_usage_error(database_url: str, pg_schema: str, args: tuple[str, ...]) -> None:
    # When a dashboard or funnel is asked for a window of no time (it printed an empty table, exit 0)
    done = run(database_url, pg_schema, *args)
    # Then it is refused in one line with the usage exit code, as a malformed window is
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        f"error: since: '{args[args.index('--since') + 1]}' is an empty window: give one above zero,"
        " like 30m, 24h or 7d"
    ]
    assert done.stdout == ""


def test_the_longest_window_itself_is_read() -> None:
    assert parse_since("99999w") == MAX_SINCE
    with pytest.raises(ValidationError, match="longer than the longest window"):
        parse_since("699994d")


@pytest.mark.parametrize("since", ["100000s", "000001h", "\u0663d", "1\uff10m"])
def test_a_window_the_api_refuses_is_refused_by_the_cli_too(since: str, memory_http: TestClient) -> None:
    # The CLI took six digits and any script's digits where the API's pattern takes five ASCII
    # ones: the same window answered by one and refused by the other
    assert since_refused_by_the_api(memory_http, since)
    with pytest.raises(ValidationError) as refused:
        parse_since(since)
    assert refused.value.field == "since"


@pytest.mark.parametrize("since", ["99999s", "00001h", " 7d ", "30m"])
def test_a_window_the_api_takes_is_taken_by_the_cli_too(since: str, memory_http: TestClient) -> None:
    assert not since_refused_by_the_api(memory_http, since)
    assert parse_since(since) > timedelta(0)


def since_refused_by_the_api(http: TestClient, since: str) -> bool:
    """Whether the dashboard refuses ``since`` (the in-memory engine has no dashboard, so a
    window it takes is refused for that instead, naming no query field)."""
    answer = http.get("/v1/dashboard", params={"since": since})
    assert answer.status_code == 422, answer.text
    return bool(answer.json()["error"].startswith("query.since"))


def test_an_unknown_reprice_model_is_refused_before_the_table_is_printed(
    database_url: str, pg_schema: str
) -> None:
    # Given a recorded step
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "customer_service")
        engine.record_step("s-1", "greet")
    # When the dashboard is asked to reprice at a model without a price
    done = run(database_url, pg_schema, "dashboard", "--since", "1h", "--reprice-as", "nosuchmodel")
    # Then only the refusal is printed
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: reprice_as: no price for 'nosuchmodel'")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("dashboard", "--tenant", "a\x01"),
        ("dashboard", "--tenant", ""),
        ("funnel", "customer_service", "--tenant", " "),
        ("projections", "tenant-views", ""),
        ("projections", "tenant-views", "a\x01"),
        ("projections", "tenant-views", "t" * 300),
        ("dashboard", "--tenant", "t" * 201),
        ("budgets", "list", "--tenant", "x\x01"),
        ("budgets", "set", "tenant", "--limit", "5", "--tenant", "x\x01"),
        ("keys", "list", "--tenant", "x\x01"),
    ],
)
def test_a_tenant_that_is_not_a_name_is_refused(
    database_url: str, pg_schema: str, args: tuple[str, ...]
) -> None:
    # When a command names a blank tenant, one with a control character, or one too long
    done = run(database_url, pg_schema, *args)
    # Then it is refused in one line (nothing was shown, no tenant schema made, nothing stored)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: tenant: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_a_duration_that_rounds_to_nothing_is_said_as_a_duration(database_url: str, pg_schema: str) -> None:
    # Given a session
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "customer_service")
    # When it is extended by a fraction of an hour too small to be a microsecond
    done = run(database_url, pg_schema, "extend", "s-1", "--hours", "1e-12")
    # Then the refusal says the value as it was given and the bounds in the option's unit,
    # not Python's repr of a timedelta
    assert done.returncode == 2
    assert done.stderr.strip() == "error: hours: must be at least 1 ms (2.78e-07 hours), got 1e-12"


@pytest.mark.parametrize("hours", ["9999", "8784"])
def test_extending_past_the_bound_says_how_much_can_still_be_added(
    database_url: str, pg_schema: str, hours: str
) -> None:
    # Given a session that lives a day
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "customer_service")
    # When it is extended by more hours than its expiry may move ahead
    done = run(database_url, pg_schema, "extend", "s-1", "--hours", hours)
    # Then the refusal says how much can still be added, in one line, and nothing was recorded
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: hours: the expiry would be "), line  # the option given
    assert "must lie at most 366 days ahead" in line
    assert line.endswith("can still be added"), line
    assert "at most 365 days, 0:" in line
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        assert len(engine.history("s-1")) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--latency-ms", "inf"), "error: latency_ms: must be a number from 0 to 600,000, got inf"),
        (("--latency-ms", "-5"), "error: latency_ms: must be a number from 0 to 600,000, got -5.0"),
        (("--retry-after", "-1"), "error: retry_after: must be a number from 0 to 3,600, got -1.0"),
        (("--api-key", ""), "error: api_key: must not be blank (leave it out to accept any key)"),
        # A key no header can carry: the simulator listened, and refused every request 401
        (
            ("--api-key", "sk-sim\n"),
            "error: api_key: must be printable ASCII with no space at either end (a header carries it),"
            " got 'sk-sim\\n'",
        ),
        (
            ("--api-key", " sk-sim"),
            "error: api_key: must be printable ASCII with no space at either end (a header carries it),"
            " got ' sk-sim'",
        ),
    ],
)
def test_the_simulator_refuses_settings_that_would_hang_or_refuse_every_request(
    database_url: str, pg_schema: str, args: tuple[str, ...], said: str
) -> None:
    # When the simulator is started with an infinite or negative wait, or a blank key
    done = run(database_url, pg_schema, "simulate-llm", "--port", "0", *args)
    # Then it is refused in one line before it listens
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == said
    assert "listening" not in done.stdout


def test_the_cli_measures_a_window_from_the_clock_the_calls_were_stamped_by(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a database whose clock (what every engine stamps events by) is 10 minutes behind
    # this host's, and calls recorded just now by it
    def behind() -> datetime:
        return datetime.now(UTC) - timedelta(minutes=10)

    monkeypatch.setattr(Engine, "_database_clock", lambda engine: behind)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("w-1", "cs")
        engine.record_step("w-1", "greet", usage=LlmUsage(request_model="gpt-4.1", input_tokens=1))
    # When the dashboard and the funnel of the last 5 minutes are printed
    shown = run(database_url, pg_schema, "dashboard", "--since", "5m")
    funnel = run(database_url, pg_schema, "funnel", "cs", "--since", "5m")
    # Then they hold those calls: measured from this host's clock, the window left them out
    assert shown.returncode == 0, shown.stderr
    assert "gpt-4.1" in shown.stdout, shown.stdout
    assert funnel.returncode == 0, funnel.stderr
    assert "funnel cs: 1 sessions" in funnel.stdout, funnel.stdout


def test_a_funnel_can_be_ordered_by_steps_whose_names_hold_commas_or_spaces_at_their_ends(
    database_url: str, pg_schema: str
) -> None:
    # Given steps named with a comma and with spaces around the name (names may hold both)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("o-1", "cs")
        for step in ("a,b", "  padded  ", "c"):
            engine.record_step("o-1", step)
    # When the funnel is ordered by them, one --step each (--steps splits at commas and strips
    # each name: 'a,b' read as 'a' and 'b', '  padded  ' as 'padded', both refused as unknown)
    order = ("--step", "c", "--step", "a,b", "--step", "  padded  ")
    done = run(database_url, pg_schema, "funnel", "cs", *order)
    # Then the rows come in that order, each name as written
    assert done.returncode == 0, done.stderr
    steps = [line.split()[0] for line in done.stdout.splitlines() if line.strip()[:1] in ("c", "a", "p")]
    assert steps == ["c", "a,b", "padded"], done.stdout
    # And giving both forms is a usage error, on one line
    both = run(database_url, pg_schema, "funnel", "cs", "--steps", "c", "--step", "c")
    assert both.returncode == 2
    assert both.stderr.strip() == "error: steps: give --steps or --step, not both"
