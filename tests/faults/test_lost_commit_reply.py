"""A commit whose reply never reaches the client: the call is stored once, with or without a key."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowledger.infrastructure import Engine
from tests.faults.ledger import WriterLoad, fault_settings, tally
from tests.faults.proxy import losing_proxy
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    ("group_commit", "lost"),
    [(False, (25, 90, 160)), (True, (10, 30, 50))],  # grouped saves make fewer commits
    ids=["a-commit-per-save", "group-commit"],
)
def test_b_a_lost_commit_reply_stores_no_step_twice(
    private_postgres: Callable[..., PrivateServer],
    report: Callable[[str], None],
    group_commit: bool,
    lost: tuple[int, ...],
) -> None:
    # Given eight writers (no idempotency keys) talking to the server through a proxy
    server = private_postgres()
    with losing_proxy("127.0.0.1", server.port) as proxy:
        engine = Engine(settings=fault_settings(proxy.url_for(server.url), group_commit=group_commit))
        sessions = [f"lost-reply-{i}" for i in range(4)]
        for session in sessions:
            engine.start_session(session, "customer_service")

        # When the replies to three of their committed appends are lost
        proxy.lose_reply_of(*lost)
        load = WriterLoad(engine, sessions, threads=8, calls_per_thread=30).start()
        try:
            load.join(timeout_s=60)
        finally:
            load.stop()
        engine.close()
        dropped = proxy.dropped

    # Then no call was stored twice and no acknowledged call is missing
    result = tally(server.url, "faults", load.acknowledged, load.errors)
    report(f"{result.line()} replies_lost={dropped}")
    assert dropped == 3, "the proxy did not lose the replies it was told to"
    assert result.lost == 0
    assert result.doubled == 0
