"""A save that never reached the server says its outcome is known: nothing was stored.

An outside probe (a 2-4 ms deadline, 400 calls; and writers queued for a pool's connections)
saw every such failure say "the outcome of the save is unknown: it may have been stored;
retry with the same idempotency key", though no connection had been taken and nothing sent:
a caller without a key could not tell that a retry was safe.
"""

from __future__ import annotations

import pytest

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("group_commit", [False, True], ids=["a-commit-per-save", "group-commit"])
def test_a_save_that_found_no_connection_is_not_an_unknown_outcome(
    database_url: str, pg_schema: str, group_commit: bool
) -> None:
    settings = make_settings(
        database_url=database_url,
        schema=pg_schema,
        pool_size=1,
        operation_deadline_s=1.0,
        group_commit=group_commit,
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s", "wf")
        engine.record_step("s", "warm")
        # Given the pool's only connection lent elsewhere for longer than the deadline
        pool = engine._app.recorder.datastore.pool  # type: ignore[attr-defined]
        held = pool.getconn()
        try:
            # When a step is recorded, its session already loaded (cached): the save itself waits
            with pytest.raises(StoreUnavailable) as raised:
                engine.record_step("s", "during", input={"n": 1})
        finally:
            pool.putconn(held)
        # Then the error says nothing was stored, and nothing was
        assert not raised.value.outcome_unknown, raised.value
        assert "outcome" not in str(raised.value)
        assert [r.step for r in engine.session_steps("s")] == ["warm"]
