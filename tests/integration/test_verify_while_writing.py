"""``audit verify`` on a live log finds only what was done to it, not what was done meanwhile.

A verification is several reads: the checkpoints, the anchor file, the retention bases, the
rows. A checkpoint taken between the database read and the anchor file's read was "in the
anchor file but not in the database: it was dropped"; sessions archived (or restored)
between the bases and the rows were "deleted". Here each of those writes is made to land
between two of the verification's reads, and the verification must come out clean.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres import chain_verify
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.projections import projector_for
from flowledger.projections.retention import archive
from tests.integration.conftest import CLOCK_START
from tests.support.clock import SetClock

pytestmark = pytest.mark.postgres

START = CLOCK_START


@pytest.fixture
def engine(clocked_engine: Engine) -> Engine:
    return clocked_engine


def sessions(engine: Engine, prefix: str, count: int) -> None:
    for n in range(count):
        session_id = f"{prefix}{n}"
        engine.start_session(session_id, "customer_service", user_id=f"u{n}")
        for step in range(3):
            engine.record_step(
                session_id, f"step_{step}", input={"n": step}, idempotency_key=f"{session_id}-{step}"
            )
        engine.complete_session(session_id, {"done": True})


def after_first_call(monkeypatch: pytest.MonkeyPatch, name: str, meanwhile: Any) -> list[int]:
    """Run ``meanwhile()`` right after ``chain_verify.<name>`` first returns; the calls made."""
    real = getattr(chain_verify, name)
    calls: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if not calls:
            meanwhile()
        calls.append(1)
        return result

    monkeypatch.setattr(chain_verify, name, wrapped)
    return calls


def test_a_checkpoint_taken_while_verifying_is_not_reported_dropped(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a log with a checkpoint, anchored in the key directory's anchor file
    sessions(engine, "s", 3)
    engine.audit.checkpoint()
    real_checkpoints = engine.audit.checkpoints
    taken: list[int] = []

    def checkpoints_then_another(conn: Any) -> Any:
        read = list(real_checkpoints(conn))
        if not taken:  # (taking a checkpoint reads the checkpoints too)
            taken.append(1)
            sessions(engine, "t", 1)
            engine.audit.checkpoint()  # committed, then anchored, while the verification runs
        return read

    # When a checkpoint is committed and anchored right after the verification read the database's
    monkeypatch.setattr(engine.audit, "checkpoints", checkpoints_then_another)
    report = verify_chain(engine.audit)
    # Then nothing is reported: the new checkpoint is not "dropped"
    assert report.ok, [f.describe() for f in report.findings]
    monkeypatch.undo()
    # And the next verification checks it against its anchor as usual
    again = verify_chain(engine.audit)
    assert again.ok, [f.describe() for f in again.findings]
    assert again.checkpoint is not None
    assert again.checkpoint.seq == 2


@pytest.mark.parametrize("since_checkpoint", [False, True])
def test_sessions_archived_or_restored_while_verifying_are_not_reported_deleted(
    engine: Engine, clock: SetClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, since_checkpoint: bool
) -> None:
    # Given closed sessions old enough for their workflow's retention, and a checkpoint over them
    sessions(engine, "old", 4)
    engine.audit.checkpoint()
    clock.now = START + timedelta(days=100)
    engine.retention.set_policy("customer_service", 90)
    projector = projector_for(engine)
    projector.catch_up()
    bundles: list[str] = []

    def archive_them() -> None:
        report = archive(engine, projector, tmp_path / "archive")
        bundles.extend(report.workflows[0].bundles)

    # When they are archived between the verification's read of the bases and of the rows
    calls = after_first_call(monkeypatch, "_bases", archive_them)
    report = verify_chain(engine.audit, since_checkpoint=since_checkpoint)
    assert calls, "the verification read the bases"
    assert bundles, "the archive ran inside the verification"
    # Then nothing is reported deleted (the verification saw the log before the archive)
    assert report.ok, [f.describe() for f in report.findings]
    monkeypatch.undo()
    archived = verify_chain(engine.audit, since_checkpoint=since_checkpoint)
    assert archived.ok, [f.describe() for f in archived.findings]
    assert verify_chain(engine.audit).archived == 4

    # When they are restored between the same two reads
    def restore_them() -> None:
        for bundle in bundles:
            engine.restore_sessions(bundle)

    after_first_call(monkeypatch, "_bases", restore_them)
    report = verify_chain(engine.audit, since_checkpoint=since_checkpoint)
    # Then nothing is reported either, and the restored streams verify whole afterwards
    assert report.ok, [f.describe() for f in report.findings]
    monkeypatch.undo()
    after = verify_chain(engine.audit, since_checkpoint=since_checkpoint)
    assert after.ok, [f.describe() for f in after.findings]
