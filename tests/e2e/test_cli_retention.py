"""``flowledger retention`` end to end: a policy, a dry run, a run into a directory, the bundle
checked offline, a tampered copy refused by ``restore``, the real one restored."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from flowledger.domain import LlmUsage
from flowledger.domain.session import session_uuid
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

USAGE = LlmUsage(
    provider="openai", request_model="gpt-4.1", input_tokens=50, output_tokens=5, cost_usd=Decimal("0.0003")
)


def test_retention_cli(database_url: str, pg_schema: str, tmp_path: Path) -> None:
    three_days_ago = datetime.now(UTC) - timedelta(days=3)
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings, clock=lambda: three_days_ago) as engine:
        for n in range(3):
            engine.start_session(f"s-{n}", "support", user_id=f"u-{n}")
            engine.record_step(f"s-{n}", "answer", input={"q": n}, output={"a": n}, usage=USAGE)
            if n < 2:
                engine.complete_session(f"s-{n}", "solved")
        public_key = engine.audit.signing.public_hex

    cli = lambda *args: run_cli(database_url, pg_schema, *args)  # noqa: E731
    bad = cli("retention", "set", "--workflow", "support", "--days", "0")
    assert bad.returncode == 2, bad.stderr
    assert cli("retention", "set", "--workflow", "support", "--days", "1").returncode == 0
    assert "support" in cli("retention", "list").stdout

    dry = cli("retention", "run", "--out", str(tmp_path / "out"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "2 sessions, 6 events" in dry.stderr
    assert not (tmp_path / "out").exists()

    done = cli("retention", "run", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "2 sessions, 6 events" in done.stderr
    [bundle] = sorted((tmp_path / "out").glob("*.jsonl"))
    gone = cli("history", "s-0")
    assert gone.returncode == 3  # the events are in the bundle now
    assert "was archived" in gone.stderr
    assert cli("history", "s-2").returncode == 0  # still open: untouched
    offline = subprocess.run(
        [sys.executable, "-m", "flowledger.verify", str(bundle), "--public-key", public_key],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert offline.returncode == 0, offline.stdout + offline.stderr
    whole = cli("audit", "verify")
    assert whole.returncode == 0, whole.stderr
    assert "(2 archived, proven by their sealed bases): ok" in whole.stdout + whole.stderr
    # One archived session verifies by its base, as in the whole log (it was "not found", exit 3)
    alone = cli("audit", "verify", "--session", "s-0")
    assert alone.returncode == 0, alone.stderr
    assert "session s-0: 0 events in 0 streams (1 archived, proven by their sealed bases): ok" in (
        alone.stdout + alone.stderr
    )

    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text(bundle.read_text().replace("solved", "solvex"))
    refused = cli("retention", "restore", str(tampered))
    assert refused.returncode == 1
    assert "does not verify" in refused.stderr

    restored = cli("retention", "restore", str(bundle), "--session", "s-0")
    assert restored.returncode == 0, restored.stderr
    assert "restored 1 sessions (3 events)" in restored.stdout
    # The other session of the bundle is named as a person knows it, its stream beside it
    # (it said "left out stream 13f06d71-...: not asked for")
    s1_stream = session_uuid("default", "s-1")
    assert restored.stderr.splitlines() == [f"left out session 's-1' (stream {s1_stream}): not asked for"]
    assert cli("history", "s-0").returncode == 0
    assert cli("history", "s-1").returncode == 3
    assert cli("audit", "verify").returncode == 0


def test_removing_a_policy_that_is_not_there_is_not_found_as_for_a_budget(
    database_url: str, pg_schema: str
) -> None:
    # (it was exit 2, a validation error, where budgets remove of no budget is exit 3)
    assert (
        run_cli(
            database_url, pg_schema, "retention", "set", "--workflow", "support", "--days", "3"
        ).returncode
        == 0
    )
    removed = run_cli(database_url, pg_schema, "retention", "remove", "--workflow", "support")
    again = run_cli(database_url, pg_schema, "retention", "remove", "--workflow", "support")
    budget = run_cli(database_url, pg_schema, "budgets", "remove", "workflow", "support")

    assert removed.returncode == 0, removed.stderr
    assert again.returncode == 3
    assert again.stderr.strip() == "error: no retention policy for workflow 'support'"
    assert budget.returncode == 3
