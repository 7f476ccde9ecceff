"""The demo's scripted sessions end as a caller would end one: with a resolution object."""

from __future__ import annotations

from flowledger.adapters.cli.demo import _run_session
from flowledger.domain.session_views import SessionStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def test_a_completed_demo_session_holds_its_resolution_once_not_a_string_wrapped_twice() -> None:
    # Given the demo's scripted sessions on an in-memory engine
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        ids = [f"demo-{seed}" for seed in range(12)]
        for seed, session_id in enumerate(ids):
            _run_session(engine, session_id, seed)
        completed = [sid for sid in ids if engine.get_session(sid).status is SessionStatus.COMPLETED]
        # Then each completed one has the resolution object the demo gave, and its Completed
        # event reads {"resolution": {"outcome": ...}}, not {"resolution": {"resolution": ...}}
        assert completed
        for session_id in completed:
            assert engine.get_session(session_id).resolution == {"outcome": "resolved"}
            last = engine.history(session_id)[-1]
            assert (last.event_type, last.data) == (
                "Session.Completed",
                {"resolution": {"outcome": "resolved"}},
            )
