"""The background checkpointer after a refusal: a checkpoint refused because the log was
tampered with stays refused until someone looks, so it is said once per interval, not retried
(with a traceback) every second."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from flowledger.domain.errors import AuditError, ValidationError
from flowledger.infrastructure.engine.checkpointer import Checkpointer


class RefusingTrail:
    """A trail whose every checkpoint is refused with ``error``, counting the attempts."""

    def __init__(self, error: Exception) -> None:
        self.attempts = 0
        self.error = error

    def checkpoint(self) -> Any:
        self.attempts += 1
        raise self.error


class Appended:
    """What the checkpointer reads of the chain: how many events were appended."""

    appended = 0


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            AuditError("checkpoint refused: stream s version 3 is not sealed with the chain key"),
            "checkpoint refused: stream s version 3",
        ),
        # A key file that does not read (since the signing key and the retired keys are read at
        # each checkpoint, 832c4da): it stays so until someone mends it, like a refusal
        (
            ValidationError("FLOWLEDGER_AUDIT_KEY_DIR", "/k/retired.pub, line 2: not an Ed25519 public key"),
            "retired.pub, line 2: not an Ed25519 public key",
        ),
    ],
    ids=["refused", "bad-key-file"],
)
def test_a_refused_checkpoint_is_logged_in_one_line_and_not_retried_every_second(
    caplog: pytest.LogCaptureFixture, error: Exception, said: str
) -> None:
    # Given a checkpointer due (5 events appended, one is enough) whose checkpoints are refused
    trail = RefusingTrail(error)
    caplog.set_level(logging.WARNING)
    chain = Appended()
    checkpointer = Checkpointer(trail, chain, every_events=1, every_s=0)  # type: ignore[arg-type]
    try:
        chain.appended = 5
        deadline = time.monotonic() + 30
        while trail.attempts == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # When several of its one-second turns pass
        time.sleep(3.5)
    finally:
        checkpointer.close()
    # Then it tried once (the old code tried on every turn: 4 or more attempts)
    assert trail.attempts == 1
    # And said why in one line, without a traceback
    [record] = [r for r in caplog.records if r.name.endswith("checkpointer")]
    assert said in record.getMessage()
    assert record.exc_info is None
