"""Group commit on real PostgreSQL: concurrent saves share transactions, nothing is lost or
doubled, clashes on one session are still retried, and the audit chain still verifies."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.group_commit import GroupCommit
from tests.conftest import make_settings


def test_sixteen_threads_on_two_engines_with_group_commit_store_every_step_once(
    database_url: str, pg_schema: str
) -> None:
    # Given two engines with group commit on (like two processes), eight sessions and one
    # session that every thread shares
    settings = make_settings(
        database_url=database_url, schema=pg_schema, group_commit=True, checkpoint_every_events=0
    )
    engines = [Engine(settings=settings) for _ in range(2)]
    try:
        for name in [*(f"own-{i}" for i in range(8)), "shared"]:
            engines[0].start_session(name, "cs")

        # When sixteen threads record 20 steps each, alternating their own and the shared session
        def writer(thread: int) -> None:
            engine = engines[thread % 2]
            for n in range(20):
                session = "shared" if n % 2 else f"own-{thread % 8}"
                engine.record_step(session, f"t{thread}", input={"n": n}, idempotency_key=f"{thread}-{n}")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(writer, range(16)))

        # Then saves did share transactions, every step is there once, versions contiguous
        groups = [engine._app.recorder.group for engine in engines]  # type: ignore[attr-defined]
        assert all(isinstance(group, GroupCommit) for group in groups)
        assert sum(g.appends for g in groups) > sum(g.batches for g in groups)
        shared = engines[1].history("shared")
        keys = [e.data["idempotency_key"] for e in shared if e.event_type == "Session.StepProcessed"]
        assert len(keys) == len(set(keys)) == 160
        assert [e.version for e in shared] == list(range(1, 162))
        for i in range(8):
            assert engines[0].get_session(f"own-{i}").step_count == 20
        # And the chain over every grouped append verifies
        report = verify_chain(engines[0].audit)
        assert report.ok, report.findings
        assert report.events == 9 + 320
    finally:
        for engine in engines:
            engine.close()


@pytest.mark.default_settings
def test_group_commit_is_off_by_default(database_url: str, pg_schema: str) -> None:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    try:
        assert engine._app.recorder.group is None  # type: ignore[attr-defined]
    finally:
        engine.close()
