"""Signed checkpoints taken in the background: every N events this engine appended, or M seconds.

The thread reads nothing until this engine has appended enough (the chain counts its
commits), so an idle engine costs a wake-up a second. A failure is logged and tried again
at the next turn: checkpoints never hold up the write path. A checkpoint refused because
the log was tampered with (``AuditError``), or by a key file that does not read
(``ValidationError``), is said in one line and tried again after the checkpoint interval (5
minutes when none is set in seconds).
"""

from __future__ import annotations

import logging
import threading
import time

from flowledger.domain.errors import AuditError, ValidationError
from flowledger.infrastructure.postgres.chain import StreamChain
from flowledger.infrastructure.postgres.checkpoints import AuditTrail

_log = logging.getLogger(__name__)
_REFUSED_RETRY_S = 300.0
"""How long a refused checkpoint (``AuditError``) waits before the next try when no
checkpoint interval in seconds is set."""


class Checkpointer:
    """Takes a checkpoint when ``every_events`` were appended or ``every_s`` passed with appends."""

    def __init__(self, trail: AuditTrail, chain: StreamChain, *, every_events: int, every_s: float) -> None:
        self.trail = trail
        self.chain = chain
        self.every_events = every_events
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flowledger-checkpointer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        done, last = self.chain.appended, time.monotonic()
        tick = min(1.0, self.every_s) if self.every_s > 0 else 1.0
        refused_until = 0.0
        while not self._stop.wait(tick):
            appended = self.chain.appended - done
            due = (self.every_events > 0 and appended >= self.every_events) or (
                self.every_s > 0 and appended > 0 and time.monotonic() - last >= self.every_s
            )
            if not due or time.monotonic() < refused_until:
                continue
            try:
                self.trail.checkpoint()
            except (AuditError, ValidationError) as error:
                # The log was tampered with (or keys differ, or a key file does not read, the
                # signing key and the retired keys being read at each checkpoint): it stays so
                # until someone looks.
                # Said in one line once per interval, not retried with a traceback every turn.
                refused_until = time.monotonic() + (self.every_s if self.every_s > 0 else _REFUSED_RETRY_S)
                _log.error("%s (trying again in %.0f s)", error, refused_until - time.monotonic())
                continue
            except Exception:  # logged and retried next turn: never fatal to the engine
                _log.exception("taking a checkpoint failed; trying again later")
                continue
            done, last = done + appended, time.monotonic()

    def close(self) -> None:
        """Stop the thread (a checkpoint under way finishes first)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
