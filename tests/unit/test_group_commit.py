"""Group commit's batching (``postgres/group_commit.py``) with a recording ``write``: who
leads, what shares a batch, and what each caller gets back when a batch fails."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from eventsourcing.persistence import IntegrityError, OperationalError, StoredEvent

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.operation_deadline import operation_deadline, operation_end
from flowledger.infrastructure.postgres.group_commit import GroupCommit


def event(stream: uuid.UUID, version: int = 1) -> StoredEvent:
    return StoredEvent(stream, version, "topic", b"{}")


class Log:
    """A ``write`` that appends to a list and numbers the events; the first call can be held
    open until the test says, so that other appends queue behind it."""

    def __init__(self, hold_first: bool = False) -> None:
        self.rows: list[StoredEvent] = []
        self.calls: list[int] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self._hold = hold_first
        self.fail: type[Exception] | None = None
        self.clash: uuid.UUID | None = None
        self.ends: list[float | None] = []
        """The operation end each write ran within (what its connection is watched for)."""

    def write(self, events: Sequence[StoredEvent]) -> list[int]:
        self.calls.append(len(events))
        self.ends.append(operation_end())
        if self._hold:
            self._hold = False
            self.entered.set()
            assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail("the server went away")
        if self.clash is not None and any(e.originator_id == self.clash for e in events):
            raise IntegrityError("duplicate key value violates unique constraint")
        first = len(self.rows) + 1
        self.rows.extend(events)
        return list(range(first, first + len(events)))


def test_a_lone_append_leads_at_once_and_gets_its_ids() -> None:
    log = Log()
    group = GroupCommit(log.write)
    stream = uuid.uuid4()
    assert group.append([event(stream, 1), event(stream, 2)]) == [1, 2]
    assert group.append([event(stream, 3)]) == [3]
    assert (group.batches, group.appends) == (2, 2)
    assert log.calls == [2, 1]


def queue_behind_a_held_commit(group: GroupCommit, log: Log, count: int) -> list[list[int]]:
    """One append holds the write open while ``count`` more arrive; the ids each got."""
    streams = [uuid.uuid4() for _ in range(count + 1)]
    with ThreadPoolExecutor(count + 1) as pool:
        first = pool.submit(group.append, [event(streams[0])])
        assert log.entered.wait(10)
        rest = [pool.submit(group.append, [event(s), event(s, 2)]) for s in streams[1:]]
        while group.appends + len(group._waiting) < count + 1:  # every append queued
            threading.Event().wait(0.001)
        log.release.set()
        return [first.result(10), *(f.result(10) for f in rest)]


def test_appends_arriving_during_a_commit_share_the_next_one_and_get_their_own_ids() -> None:
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=1)

    answers = queue_behind_a_held_commit(group, log, count=5)

    # The held commit, then one batch of the five that queued behind it
    assert log.calls == [1, 10]
    assert (group.batches, group.appends) == (2, 6)
    assert answers[0] == [1]
    later = sorted(answers[1:])
    assert later == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    # Each caller's ids are the rows of its own events
    for ids in answers[1:]:
        assert log.rows[ids[0] - 1].originator_id == log.rows[ids[1] - 1].originator_id


def test_a_clash_in_a_batch_retries_each_append_alone_and_only_the_clashing_one_fails() -> None:
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=1)
    clashing = uuid.uuid4()
    others = [uuid.uuid4() for _ in range(3)]
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(group.append, [event(uuid.uuid4())])
        assert log.entered.wait(10)
        log.clash = clashing
        bad = pool.submit(group.append, [event(clashing)])
        good = [pool.submit(group.append, [event(s)]) for s in others]
        while group.appends + len(group._waiting) < 5:
            threading.Event().wait(0.001)
        log.release.set()
        assert first.result(10) == [1]
        with pytest.raises(IntegrityError, match="duplicate key"):
            bad.result(10)
        assert sorted(f.result(10)[0] for f in good) == [2, 3, 4]
    # The batch of four failed as one, then each was written alone
    assert log.calls == [1, 4, 1, 1, 1, 1]
    assert {row.originator_id for row in log.rows[1:]} == set(others)


def test_an_unknown_outcome_reaches_every_caller_of_the_batch_as_its_own_error() -> None:
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=1)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(group.append, [event(uuid.uuid4())])
        assert log.entered.wait(10)
        log.fail = OperationalError
        rest = [pool.submit(group.append, [event(uuid.uuid4())]) for _ in range(3)]
        while group.appends + len(group._waiting) < 4:
            threading.Event().wait(0.001)
        log.release.set()
        errors = []
        for future in [first, *rest]:
            with pytest.raises(OperationalError, match="the server went away") as caught:
                future.result(10)
            errors.append(caught.value)
    # The held call failed alone; the three behind it failed as one batch, one error each
    assert log.calls == [1, 3]
    assert len({id(error) for error in errors}) == 4
    assert all(isinstance(error.__cause__, OperationalError) for error in errors[1:])


def test_with_two_leaders_a_second_commit_starts_while_the_first_is_in_flight() -> None:
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=2)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(group.append, [event(uuid.uuid4())])
        assert log.entered.wait(10)
        # The first commit is still open, yet this one is written at once
        assert pool.submit(group.append, [event(uuid.uuid4())]).result(10) == [1]
        log.release.set()
        assert held.result(10) == [2]


def test_many_threads_lose_nothing_and_leadership_always_returns() -> None:
    log = Log()
    group = GroupCommit(log.write, leaders=2)
    lock = threading.Lock()
    original = log.write

    def write(events: Sequence[StoredEvent]) -> list[int]:
        with lock:  # the list is not safe for two leaders at once
            return original(events)

    group._write = write

    def writer(n: int) -> list[int]:
        stream = uuid.uuid4()
        return [i for version in range(1, 21) for i in group.append([event(stream, version)])]

    with ThreadPoolExecutor(16) as pool:
        ids = [i for mine in pool.map(writer, range(16)) for i in mine]
    assert sorted(ids) == list(range(1, 321))
    assert group.appends == 320
    assert group._leading == 0
    assert not group._waiting


def append_within(group: GroupCommit, events: list[StoredEvent], seconds: float) -> tuple[float, list[int]]:
    """``group.append`` inside an operation of ``seconds``: the operation's end, and the ids."""
    with operation_deadline(seconds) as end:
        return end, group.append(events)


def test_a_batch_is_written_within_the_earliest_end_of_its_callers_operations() -> None:
    # Given a commit held open, and two appends queued behind it with 5 s and 2 s deadlines
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=1)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(append_within, group, [event(uuid.uuid4())], 5.0)
        assert log.entered.wait(10)
        later = pool.submit(append_within, group, [event(uuid.uuid4())], 5.0)
        sooner = pool.submit(append_within, group, [event(uuid.uuid4())], 2.0)
        while group.appends + len(group._waiting) < 3:
            threading.Event().wait(0.001)
        # When the held commit ends
        log.release.set()
        ends = [first.result(10)[0], later.result(10)[0], sooner.result(10)[0]]
    # Then the batch of the two was written within the sooner end, whoever led it
    assert log.calls == [1, 2]
    assert log.ends == [ends[0], ends[2]]


def test_an_append_queued_past_its_operation_deadline_leaves_the_queue_unwritten() -> None:
    # Given a commit that stays open longer than the next caller's operation may take
    log = Log(hold_first=True)
    group = GroupCommit(log.write, leaders=1)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(group.append, [event(uuid.uuid4())])
        assert log.entered.wait(10)
        started = time.monotonic()
        queued = pool.submit(append_within, group, [event(uuid.uuid4())], 0.3)
        # Then that caller gets an error at its deadline, not when the commit ends
        with pytest.raises(OperationalError, match="deadline"):
            queued.result(5)
        assert time.monotonic() - started < 1.0
        log.release.set()
        assert first.result(10) == [1]
    # And its events were never written; leadership came back
    assert log.calls == [1]
    assert group._leading == 0
    assert not group._waiting


def test_no_leaders_is_refused_rather_than_leaving_every_append_waiting() -> None:
    with pytest.raises(ValidationError, match="group_commit_leaders: 0 is not a positive whole number"):
        GroupCommit(Log().write, leaders=0)
