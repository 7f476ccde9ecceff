"""A read that takes several queries sees one moment of the read models.

The funnel is three queries (raw) or three (roll-ups) on one connection. When the projections
committed new rows between them, the answers disagreed: a session's furthest step had no
entry among the steps reached, or a path named a step with no first time, and the funnel
raised (a soak's ``GET /v1/funnel`` answered 500). Here a whole batch of new sessions, with a
step no earlier session reached, is committed after the read's first query: the read must
return what it would have returned before that batch, and the next read must see the batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import Connection

from flowledger.infrastructure import Engine, Settings
from flowledger.projections import Projector, funnel_report, projector_for
from tests.support.schemas import drop_schemas
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC) - timedelta(hours=3)


def sessions(prefix: str, steps: tuple[str, ...], count: int) -> list[SessionScript]:
    """``count`` sessions taking ``steps`` in order, a minute apart."""
    scripts = []
    for n in range(count):
        at = T0 + timedelta(minutes=n)
        script = SessionScript(f"{prefix}{n}", "support", at)
        for step in steps:
            at += timedelta(seconds=5)
            script.step(step, at)
        scripts.append(script)
    return scripts


class CommitsAfterFirstQuery:
    """A connection whose first query is followed by ``later()`` (another connection's commit)."""

    def __init__(self, conn: Connection[Any], later: Callable[[], None]) -> None:
        self.conn, self.later, self.queries = conn, later, 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self.conn.execute(*args, **kwargs)
        self.queries += 1
        if self.queries == 1:
            self.later()
        return cursor


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    schema = f"cr_{uuid.uuid4().hex[:12]}"
    engine = Engine(settings=Settings(home=Path("/nonexistent"), database_url=database_url, schema=schema))
    try:
        yield engine
    finally:
        engine.close()
        drop_schemas(database_url, schema)


def project(engine: Engine, projector: Projector, scripts: list[SessionScript]) -> None:
    append(engine.log, interleave(scripts), per_transaction=50)
    projector.catch_up()


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_a_funnel_read_is_one_moment_of_the_read_models(engine: Engine, read: str) -> None:
    projector = projector_for(engine)
    project(engine, projector, sessions("a", ("classify", "answer"), 20))
    reader = projector.names.reader
    with projector.connect_reader() as conn:
        before = funnel_report(conn, reader, "support", tenant="default", read=read)

    late = sessions("b", ("escalate", "classify", "review", "answer"), 30)
    with projector.connect_reader() as conn:
        racing = CommitsAfterFirstQuery(conn, lambda: project(engine, projector, late))
        during = funnel_report(racing, reader, "support", tenant="default", read=read)  # type: ignore[arg-type]
    assert racing.queries >= 2  # the batch landed between this read's queries
    assert during == before

    with projector.connect_reader() as conn:
        after = funnel_report(conn, reader, "support", tenant="default", read=read)
    assert after[0].sessions == 50
    assert [s.step for s in after[0].steps] == ["escalate", "classify", "review", "answer"]


def test_every_query_on_a_reader_connection_sees_one_moment(engine: Engine) -> None:
    projector = projector_for(engine)
    project(engine, projector, sessions("a", ("classify",), 10))
    reader = projector.names.reader
    since = T0 - timedelta(hours=1)
    with projector.connect_reader() as conn:
        racing = CommitsAfterFirstQuery(conn, lambda: project(engine, projector, sessions("b", ("x",), 5)))
        first = funnel_report(racing, reader, "support", tenant="default", since=since, read="raw")  # type: ignore[arg-type]
        second = funnel_report(conn, reader, "support", tenant="default", since=since, read="raw")
    assert first == second  # every query on the connection: the moment of its first
    assert first[0].sessions == 10


def test_catching_up_ends_at_the_head_it_found_while_writes_go_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a projector behind the log, and a writer that appends an event during every batch
    # (a steady load: a dashboard read caught up inline chased the head for as long as it lasted)
    projector = projector_for(engine)
    append(engine.log, interleave(sessions("a", ("classify",), 5)), per_transaction=50)
    real_run_batch = projector.run_batch
    batches: list[int] = []

    def run_batch_while_writing(*args: Any, **kwargs: Any) -> bool:
        batches.append(1)
        assert len(batches) < 50, "catch_up chased the head"
        append(engine.log, interleave(sessions(f"w{len(batches)}-", ("classify",), 1)), per_transaction=50)
        return real_run_batch(*args, **kwargs)

    monkeypatch.setattr(projector, "run_batch", run_batch_while_writing)
    # When it catches up
    projector.catch_up()
    # Then it stops at the head the call found (one batch here), and the next call goes on from there
    assert len(batches) == 1
    monkeypatch.undo()
    projector.catch_up()
    with projector.connect_reader() as conn:
        [report] = funnel_report(conn, projector.names.reader, "support", tenant="default", read="raw")
    assert report.sessions == 6
