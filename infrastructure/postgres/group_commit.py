"""Group commit: the appends of concurrent writers in one process share one transaction.

Each save is one round trip and one commit (one WAL flush). When several threads save at
once, the first becomes the *leader*: it takes every append waiting at that moment and
writes them with one call of the append function (one transaction, every stream still
version-checked by the table's unique key), then hands over to the next waiting writer, if
any, and returns. A lone writer leads at once, so nothing waits for company: batches form
only while a commit is already in flight (natural batching, no timer).

What each caller gets is what it would have got alone:

- the batch committed: each its own notification ids, after the commit;
- the batch hit a unique-key clash (someone else wrote one of its streams' versions
  first): the batch rolled back as a whole, so each append is tried again on its own and
  each caller gets its own outcome (the clashing one ``IntegrityError``, the others ids);
- the outcome is unknown (the connection broke, the reply was lost) or any other error:
  every caller gets that error; each then reads its own stream for its command id, as
  after its own lost reply (``docs/write-path.md``), because the batch committed or not
  as one.

Appends inside a caller's open transaction (the task assigner's) are never grouped.

Deadlines: a batch is written within the earliest end of its callers' operations (its
connection is watched for that end, ``watchdog.py``), so no caller waits on it past its own;
an append whose operation ends while it waits for a leader leaves the queue unwritten, and
one whose operation has ended when its batch is taken is answered without being written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from time import monotonic
from typing import Any

from eventsourcing.persistence import IntegrityError, StoredEvent

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.operation_deadline import operation_end, operation_until
from flowledger.infrastructure.postgres.not_sent import AppendNotSent


class _Append:
    """One caller's append, waiting for a leader (or to become one)."""

    __slots__ = ("end", "error", "events", "ids", "lead", "ready")

    def __init__(self, events: Sequence[StoredEvent]) -> None:
        self.events = events
        self.end = operation_end()
        self.ids: list[int] | None = None
        self.error: BaseException | None = None
        self.lead = False
        self.ready = threading.Event()


class GroupCommit:
    """Batches concurrent ``append(events)`` calls into one call of ``write(events)``.

    ``write`` appends a list of stored events (of any streams) atomically and returns their
    notification ids in order; it raises the event library's errors.
    """

    def __init__(self, write: Callable[[Sequence[StoredEvent]], list[int]], leaders: int = 1) -> None:
        if leaders < 1:  # with none, every append would wait for a leader forever
            raise ValidationError("group_commit_leaders", f"{leaders} is not a positive whole number")
        self._write = write
        self._lock = threading.Lock()
        self._waiting: list[_Append] = []
        self._leaders = leaders
        self._leading = 0
        self.batches = 0
        """Transactions written (for benches and tests)."""
        self.appends = 0
        """Appends written in them."""

    def append(self, events: Sequence[StoredEvent]) -> list[int]:
        """Append ``events`` (one caller's, atomically), possibly with other callers'; their ids."""
        mine = _Append(events)
        with self._lock:
            self._waiting.append(mine)
            mine.lead = self._leading < self._leaders
            self._leading += mine.lead
        if not mine.lead:
            self._wait_turn(mine)
        if mine.lead:  # from the start, or handed over by the previous leader
            self._lead()
        if mine.error is not None:
            raise mine.error
        assert mine.ids is not None
        return mine.ids

    def _wait_turn(self, mine: _Append) -> None:
        """Wait until answered or made leader; leave the queue if the operation ends first."""
        if mine.end is None or mine.ready.wait(max(0.0, mine.end - monotonic())):
            mine.ready.wait()
            return
        with self._lock:
            if not mine.lead and mine in self._waiting:
                self._waiting.remove(mine)
                mine.error = AppendNotSent("the operation's deadline passed waiting for a group commit")
                return
        mine.ready.wait()  # taken into a batch (written within this end) or made leader

    def _lead(self) -> None:
        """Write everything waiting now, answer each caller, hand over or stop leading."""
        with self._lock:
            batch, self._waiting = self._waiting, []
            # Counted here, under the lock: two leaders write at once, and ``+=`` from both
            # threads lost counts (180 of 320 appends once).
            self.batches += 1
            self.appends += len(batch)
        try:
            now = monotonic()
            due: list[_Append] = []
            for append in batch:
                if append.end is not None and append.end <= now:
                    append.error = AppendNotSent("the operation's deadline passed before a group commit")
                else:
                    due.append(append)
            ends = [append.end for append in due if append.end is not None]
            with operation_until(min(ends)) if ends else nullcontext():
                self._write_batch(due)
        finally:
            with self._lock:
                if self._waiting:
                    successor = self._waiting[0]
                    successor.lead = True
                    successor.ready.set()
                else:
                    self._leading -= 1
            for append in batch:
                if append.ids is None and append.error is None:  # only if _write_batch died
                    append.error = RuntimeError("the group commit's leader stopped before writing")
                append.lead = False
                append.ready.set()

    def _write_batch(self, batch: list[_Append]) -> None:
        if not batch:
            return
        if len(batch) == 1:
            self._write_alone(batch[0])
            return
        events = [event for append in batch for event in append.events]
        try:
            ids = self._write(events)
        except IntegrityError:
            # One append clashed and the whole batch rolled back: each on its own now.
            for append in batch:
                self._write_alone(append)
            return
        except Exception as error:
            for append in batch:
                append.error = _copy(error)
            return
        start = 0
        for append in batch:
            append.ids = ids[start : start + len(append.events)]
            start += len(append.events)

    def _write_alone(self, append: _Append) -> None:
        try:
            append.ids = self._write(append.events)
        except Exception as error:
            append.error = error


def _copy(error: Exception) -> Exception:
    """The same error for another thread to raise (one instance raised in several threads
    would share and overwrite its traceback)."""
    try:
        copy: Any = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error
    return copy  # type: ignore[no-any-return]
