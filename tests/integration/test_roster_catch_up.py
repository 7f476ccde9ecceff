"""An engine's roster follows other engines' agent changes on PostgreSQL by version: each
refresh reads the followed agents' events past the versions it has, not every agent change
in the log (its own, and those an agent lock brought, included)."""

from __future__ import annotations

from typing import Any

import pytest

from flowledger.infrastructure import Engine
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


def test_a_refresh_applies_another_engines_agent_changes_read_by_version(
    pg_engine: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a second engine that read the roster, then the first assigned two tasks
    pg_engine.register_agent("a", "a", ["python"], 5)
    for task_id in ("t1", "t2"):
        pg_engine.create_task(task_id, "Fix it", ["python"])
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as other:
        index = other.task_reads.index
        index.refresh()
        seen = index.foreign_agent_changes
        for task_id in ("t1", "t2"):
            pg_engine.assign_task(task_id)
        recorder: Any = other._app.recorder  # type: ignore[attr-defined]
        tailed: list[Any] = []
        select = recorder.select_notifications

        def spied(*args: Any, **kwargs: Any) -> Any:
            tailed.append(kwargs.get("topics"))
            return select(*args, **kwargs)

        monkeypatch.setattr(recorder, "select_notifications", spied)
        # When the second refreshes
        index.refresh()
        # Then it holds the agent as stored, counted the two changes as another engine's,
        # and tailed the log for creations only
        assert index.agent_version("a") == pg_engine.get_agent("a").version == 3
        assert index.agent_profile("a").load == 2
        assert index.foreign_agent_changes == seen + 2
        assert all("TaskAccepted" not in " ".join(topics or ()) for topics in tailed)
