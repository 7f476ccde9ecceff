"""Keep the live builds current from live notifications (LISTEN/NOTIFY through the recorder).

Run as its own process (``flowledger projections follow``). Several followers may run at
once: every batch locks the tracking rows and skips what another follower already applied.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from queue import Empty, Full, Queue
from typing import Any

import psycopg
from eventsourcing.persistence import Notification
from psycopg import Connection

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import outages
from flowledger.projections.catalog import install
from flowledger.projections.processor import BatchHook, Projector


def follow(
    projector: Projector,
    wanted: Sequence[str] | None = None,
    *,
    stop: threading.Event,
    ready: threading.Event | None = None,
    on_batch: BatchHook | None = None,
) -> int:
    """Catch up, then apply new notifications as they arrive until ``stop`` is set.

    ``ready`` is set once caught up and subscribed. Returns the notifications applied.
    """
    projections = projector.select(wanted)
    resolve = projector.live(projections)
    applied = 0

    def run(conn: Connection[Any]) -> None:
        nonlocal applied
        # Every use of ``conn`` is an operation of the projector's deadline, watched: a path
        # that stopped relaying mid-batch held the follower, silent, until it gave up (29 s
        # with a 2 s deadline); now the batch ends with StoreUnavailable and it starts again.
        with projector.watched(conn, "install the read models"):
            install(conn, projector.names, projections, key=projector.chain_key)
        # A stop request (SIGTERM, Ctrl-C) ends the catch-up between batches: a follower
        # started on a long backlog ignored it until it had read the whole log.
        applied += projector.drive(conn, resolve, on_batch=on_batch, halt=stop.is_set, bounded=True)
        if stop.is_set():
            return
        with projector.watched(conn, "read the build positions"), conn.cursor() as cur:
            targets = resolve(cur)
            after = min(projector.positions(cur, [t.schema for t in targets]).values(), default=0)
        inbox = _inbox(projector.batch_size)
        halted = threading.Event()  # the main loop has ended: nobody takes from the inbox
        # With the rows of unknown topics too, as ``Projector.read`` reads them (``strangers``).
        topics = projector.read_topics(set().union(*(p.topics for p in projections)))
        with projector.recorder.subscribe(gt=after, topics=topics) as subscription:

            def feed() -> None:
                try:
                    for notification in subscription:
                        if not _offer(inbox, notification, halted):
                            return
                except BaseException as error:  # surfaced in the main loop
                    _offer(inbox, error, halted)
                _offer(inbox, None, halted)

            feeder = threading.Thread(target=feed, name="projection-feed", daemon=True)
            feeder.start()
            if ready is not None:
                ready.set()
            try:
                while not stop.is_set():
                    batch = _next_batch(inbox, projector.batch_size)
                    if not batch:
                        continue
                    with projector.watched(conn, "project a batch of the log"):
                        done = projector.run_batch(conn, resolve, batch, after=after, on_batch=on_batch)
                    if done:
                        applied += len(batch)
                    else:
                        # A build moved behind what we were fed (a switch): read instead.
                        applied += projector.drive(
                            conn, resolve, on_batch=on_batch, halt=stop.is_set, bounded=True
                        )
                    after = batch[-1].id
            finally:
                halted.set()
                subscription.stop()
                feeder.join(timeout=5)

    with projector.connect() as conn, _cancelled_when(stop, conn):
        try:
            run(conn)
        except psycopg.errors.QueryCanceled:
            if not stop.is_set():
                raise
            # Stopped while it waited on the database: the batch rolled back, nothing half-written.
    return applied


STOP_POLL_S = 0.2
"""How often a follower looks for a stop request while a statement runs."""


@contextmanager
def _cancelled_when(stop: threading.Event, conn: Connection[Any]) -> Iterator[None]:
    """Cancel what ``conn`` is running once ``stop`` is set: a batch waiting for a lock (a
    verify holding the build still while it compares, a rebuild's switch, someone's open
    transaction) kept a follower from stopping until it got it (SIGTERM acted after 36.6 s
    behind a lock held for 40 s)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(STOP_POLL_S):
            if stop.is_set():
                with contextlib.suppress(psycopg.Error):
                    conn.cancel_safe(timeout=5)
                return

    watcher = threading.Thread(target=watch, name="projection-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)


INBOX_BATCHES = 4
"""How many batches of notifications a follower holds while it applies one. The rest wait
in the database (the subscription reads on when there is room): the inbox had no bound,
so a follower slower than the writers, or held behind a lock, kept the whole backlog in
memory."""

Inbox = Queue[Notification | BaseException | None]


def _inbox(batch_size: int) -> Inbox:
    return Queue(maxsize=INBOX_BATCHES * max(batch_size, 1))


def _offer(inbox: Inbox, item: Notification | BaseException | None, halted: threading.Event) -> bool:
    """Put ``item`` in ``inbox``, waiting for room; False (not put) once ``halted`` is set."""
    while not halted.is_set():
        try:
            inbox.put(item, timeout=0.1)
        except Full:
            continue
        return True
    return False


def _next_batch(inbox: Inbox, limit: int) -> list[Notification]:
    """Wait briefly for one notification, then take whatever else is already waiting."""
    batch: list[Notification] = []
    try:
        item = inbox.get(timeout=0.1)
        while True:
            if isinstance(item, BaseException):
                raise item
            if item is None:
                # Nothing stops the subscription but us: ending early means its connection went.
                raise StoreUnavailable("follow", "the notification subscription ended")
            batch.append(item)
            if len(batch) >= limit:
                break
            item = inbox.get_nowait()
    except Empty:
        pass
    return batch


# What a lost or restarted database looks like to the follower (ours, psycopg's own errors,
# and the event library's wrappers of them when they surface through the recorder).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (StoreUnavailable, *outages.CONNECTION_ERRORS)


FIRST_BACKOFF_S = 0.5
"""The wait before the first try after a connection is lost."""
MAX_BACKOFF_S = 2.0
"""The longest wait between tries. Each try already spends the operation deadline trying to
connect (every 0.2 s while the server refuses), so a long wait only leaves the read models
behind once the database is back: with waits doubling to 30 s, a 55 s outage left a follower
22.9 s behind an engine whose pool was back in 0.1 s."""


def follow_until_stopped(
    projector: Projector,
    wanted: Sequence[str] | None = None,
    *,
    stop: threading.Event,
    on_reconnect: Callable[[BaseException, float], None] | None = None,
    max_backoff_s: float = MAX_BACKOFF_S,
) -> None:
    """``follow`` until ``stop`` is set, starting again after a lost connection.

    Waits 0.5 s, doubling up to ``max_backoff_s`` (2 s) while tries fail, between tries;
    ``on_reconnect`` hears of each (the error and the wait). A try that got back to
    following (caught up and subscribed) ends that outage: the next loss waits 0.5 s again
    (the waits doubled over the follower's life, so after a few brief outages, each
    recovered from, it waited the longest wait before trying again after every later one).
    Nothing is
    lost or applied twice by starting again: each batch's rows and tracking position commit
    together, so ``follow`` resumes from them.
    """
    first = min(FIRST_BACKOFF_S, max_backoff_s)
    backoff = first
    while not stop.is_set():
        following = threading.Event()
        try:
            follow(projector, wanted, stop=stop, ready=following)
            return
        except CONNECTION_ERRORS as error:
            if stop.is_set():
                return  # a last error while stopping just ends the run
            if following.is_set():
                backoff = first  # it had recovered: this is a new outage
            if on_reconnect is not None:
                on_reconnect(error, backoff)
            stop.wait(backoff)  # a stop request ends the wait at once
            backoff = min(backoff * 2, max_backoff_s)
