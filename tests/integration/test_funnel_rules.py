"""Funnel rules on branching paths: conversion per path never above 100 %, a step order of
known steps only, a window on session start, and group names kept in the CLI's headings."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain import LlmUsage, ValidationError
from flowledger.infrastructure import Engine
from flowledger.projections import FunnelReport, Projector, funnel_report, projector_for
from tests.support.cli import run_cli
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

NOW = datetime.now(UTC).replace(microsecond=0)
UNKNOWN_STEP = (
    "steps: unknown in workflow 'cs': nosuch; known steps: classify, escalate, greet, human, order_status"
)


def call(model: str) -> LlmUsage:
    return LlmUsage(provider="sim", request_model=model, input_tokens=10, output_tokens=2)


def history() -> list[SessionScript]:
    """Workflow ``cs``: four sessions greet → classify → order_status, one greet → classify →
    escalate → human (started first, so escalate sorts before order_status), one that only
    greeted, started two days ago."""
    scripts = []
    escalated = SessionScript("esc", "cs", NOW - timedelta(hours=2), metadata={"channel": "[phone]"})
    escalated.step("greet", NOW - timedelta(hours=2), usage=call("[big]-model"))
    escalated.step("classify", NOW - timedelta(hours=2) + timedelta(seconds=5))
    escalated.step("escalate", NOW - timedelta(hours=2) + timedelta(seconds=10))
    escalated.step("human", NOW - timedelta(hours=2) + timedelta(seconds=20))
    scripts.append(escalated)
    for i in range(4):
        start = NOW - timedelta(hours=1) + timedelta(minutes=i)
        script = SessionScript(f"ord-{i}", "cs", start, metadata={"channel": "web"})
        script.step("greet", start + timedelta(seconds=1), usage=call("small"))
        script.step("classify", start + timedelta(seconds=2))
        script.step("order_status", start + timedelta(seconds=3)).complete(start + timedelta(seconds=4))
        scripts.append(script)
    old = SessionScript("old", "cs", NOW - timedelta(days=2), metadata={"channel": "web"})
    old.step("greet", NOW - timedelta(days=2) + timedelta(seconds=1))
    scripts.append(old)
    return scripts


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    append(pg_engine.log, interleave(history()))
    built = projector_for(pg_engine)
    built.catch_up()
    return built


def report(projector: Projector, **options: object) -> list[FunnelReport]:
    with projector.connect() as conn:
        return funnel_report(conn, projector.names.reader, "cs", tenant="default", **options)  # type: ignore[arg-type]


def test_conversion_from_the_previous_step_follows_each_sessions_path(projector: Projector) -> None:
    [funnel] = report(projector)
    steps = {s.step: s for s in funnel.steps}
    assert [s.step for s in funnel.steps] == ["greet", "classify", "escalate", "order_status", "human"]
    # greet: every session starts there; order_status: 4 of the 5 that classified (not 4 of
    # the 1 that reached escalate, the step shown above it: that read 400 %)
    assert {name: s.step_conversion for name, s in steps.items()} == {
        "greet": 1.0,
        "classify": pytest.approx(5 / 6),
        "escalate": pytest.approx(1 / 5),
        "order_status": pytest.approx(4 / 5),
        "human": 1.0,
    }


def test_conversion_never_exceeds_100_percent_in_any_segment_or_step_order(projector: Projector) -> None:
    reports = [
        *report(projector),
        *report(projector, by="model"),
        *report(projector, by="metadata.channel"),
        *report(projector, steps=["human", "order_status", "greet"]),
    ]
    for funnel in reports:
        for step in funnel.steps:
            assert 0 < step.step_conversion <= 1, (funnel.segment, step)
            assert 0 < step.overall_conversion <= 1, (funnel.segment, step)


def test_a_step_order_names_only_steps_the_workflow_has(projector: Projector) -> None:
    with pytest.raises(
        ValidationError,
        match=re.escape(UNKNOWN_STEP),
    ):
        report(projector, steps=["greet", "nosuch"])
    with pytest.raises(ValidationError, match=r"steps: name each step once; repeated: 'greet'"):
        report(projector, steps=["greet", "greet"])


def test_a_window_counts_only_sessions_started_in_it(projector: Projector) -> None:
    [funnel] = report(projector, since=NOW - timedelta(days=1))
    assert funnel.sessions == 5
    assert funnel.steps[0].reached == 5


def test_the_cli_shows_group_names_that_look_like_markup(
    projector: Projector, database_url: str, pg_schema: str
) -> None:
    by_channel = run_cli(database_url, pg_schema, "funnel", "cs", "--by", "metadata.channel")
    assert by_channel.returncode == 0, by_channel.stderr
    assert "funnel cs [[phone]]: 1 sessions" in by_channel.stdout
    assert "funnel cs [web]: 5 sessions" in by_channel.stdout
    by_model = run_cli(database_url, pg_schema, "funnel", "cs", "--by", "model")
    assert "funnel cs [[big]-model]: 1 sessions" in by_model.stdout
    assert "funnel cs [small]: 4 sessions" in by_model.stdout


def test_the_cli_refuses_an_unknown_step_naming_the_known_ones(
    projector: Projector, database_url: str, pg_schema: str
) -> None:
    result = run_cli(database_url, pg_schema, "funnel", "cs", "--steps", "greet,nosuch")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {UNKNOWN_STEP}"]


def test_the_cli_funnel_takes_a_window(projector: Projector, database_url: str, pg_schema: str) -> None:
    recent = run_cli(database_url, pg_schema, "funnel", "cs", "--since", "1d")
    assert recent.returncode == 0, recent.stderr
    assert "funnel cs: 5 sessions" in recent.stdout
    everything = run_cli(database_url, pg_schema, "funnel", "cs")
    assert "funnel cs: 6 sessions" in everything.stdout
    bad = run_cli(database_url, pg_schema, "funnel", "cs", "--since", "yesterday")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: since: 'yesterday' is not a duration like 30m, 24h or 7d"
    ]
